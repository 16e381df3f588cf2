"""Central's decisions beyond versions and rollouts on SQLite (``decisions`` in
``central.sqlite3``): INT8 drift flags and fallbacks, clear baselines, artifact verdicts and
the transfer policy, so a restarted central keeps them. One process writes them: no fence."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from central.storage.sqlite.database import SQLiteDatabase, database

__all__ = ["SQLiteDecisionStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
"""
_UPSERT = (
    "INSERT INTO decisions (kind, key, body) VALUES (?, ?, ?)"
    " ON CONFLICT (kind, key) DO UPDATE SET body = excluded.body"
)


class SQLiteDecisionStore:
    """``DecisionRecords`` on a SQLite file (or ``central.sqlite3``'s shared connection)."""

    def __init__(self, target: Path | SQLiteDatabase) -> None:
        self._db = database(target)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Done with the connection (closed with its last user)."""
        self._db.release()

    def load(self, kind: str) -> dict[str, Any]:
        """Every record of ``kind``."""
        return {
            str(r[0]): json.loads(r[1])
            for r in self._db.query("SELECT key, body FROM decisions WHERE kind = ?", (kind,))
        }

    def write(
        self,
        kind: str,
        puts: Mapping[str, Any],
        deletes: Iterable[str] = (),
        *,
        fence: int | None = None,
        also: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Upsert and delete in one transaction (``fence`` is for replicas; one process has none)."""
        rows = [(kind, k, json.dumps(v)) for k, v in puts.items()]
        rows += [(k2, k, json.dumps(v)) for k2, records in (also or {}).items() for k, v in records.items()]
        with self._db.transaction() as conn:
            conn.executemany("DELETE FROM decisions WHERE kind = ? AND key = ?", [(kind, k) for k in deletes])
            conn.executemany(_UPSERT, rows)

    def add(self, kind: str, key: str, body: Any) -> bool:
        """Store ``body`` unless ``key`` has a record already; True if stored."""
        cur = self._db.execute(
            "INSERT INTO decisions (kind, key, body) VALUES (?, ?, ?) ON CONFLICT (kind, key) DO NOTHING",
            (kind, key, json.dumps(body)),
        )
        return cur.rowcount > 0
