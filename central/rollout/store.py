"""Rollouts and each model's stable version in SQLite (``rollouts.sqlite3`` beside the
registry), so a restarted central serves the same versions and resumes its rollouts.

``releases`` holds, per model, the version every node serves unless a rollout says
otherwise (``stable``) and ``epoch``: the highest rollout id a plain push superseded."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from central.rollout.model import Rollout
from central.settings import StoreSettings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    model TEXT PRIMARY KEY,
    stable TEXT,
    epoch INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_model ON rollouts (model, id);
"""


@dataclass(frozen=True)
class Release:
    """A model's stable version and the last rollout id a plain push superseded."""

    model: str
    stable: str | None
    epoch: int


class RolloutRecords(Protocol):
    """What ``RolloutBook`` needs of a store: SQLite (``RolloutStore``) or PostgreSQL."""

    def close(self) -> None: ...
    def releases(self) -> dict[str, Release]: ...
    def set_release(self, model: str, stable: str | None, epoch: int) -> None: ...
    def insert(self, rollout: Rollout) -> Rollout: ...
    def update(self, rollout: Rollout) -> None: ...
    def all(self) -> list[Rollout]: ...
    def max_id(self, model: str) -> int: ...


def open_rollout_store(settings: StoreSettings, sqlite_path: Path) -> RolloutRecords:
    """PostgreSQL when ``settings.url`` is set (migrated on open), else SQLite at ``sqlite_path``."""
    if settings.url is None:
        return RolloutStore(sqlite_path)
    from central.rollout.postgres_store import PostgresRolloutStore  # the [postgres] extra

    return PostgresRolloutStore(
        settings.url, pool_size=settings.pool_size, connect_timeout_s=settings.connect_timeout_s
    )


class RolloutStore:
    """Rollout rows and release pointers; safe to call from worker threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def releases(self) -> dict[str, Release]:
        """Every model's release pointer, by model."""
        rows = self._query("SELECT model, stable, epoch FROM releases")
        return {r[0]: Release(r[0], r[1], int(r[2])) for r in rows}

    def set_release(self, model: str, stable: str | None, epoch: int) -> None:
        """Point ``model`` at ``stable``; rollouts with an id up to ``epoch`` no longer apply."""
        self._execute(
            "INSERT INTO releases (model, stable, epoch) VALUES (?, ?, ?)"
            " ON CONFLICT (model) DO UPDATE SET stable = excluded.stable, epoch = excluded.epoch",
            (model, stable, epoch),
        )

    def insert(self, rollout: Rollout) -> Rollout:
        """Store a new rollout; returns it with its id."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO rollouts (model, state, body) VALUES (?, ?, '{}')", (rollout.model, rollout.state)
                )
                stored = rollout.model_copy(update={"id": int(cur.lastrowid or 0)})
                self._db.execute("UPDATE rollouts SET body = ? WHERE id = ?", (stored.model_dump_json(), stored.id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return stored

    def update(self, rollout: Rollout) -> None:
        """Persist a rollout's new state and progress."""
        self._execute(
            "UPDATE rollouts SET state = ?, body = ? WHERE id = ?",
            (rollout.state, rollout.model_dump_json(), rollout.id),
        )

    def all(self) -> list[Rollout]:
        """Every rollout, oldest first."""
        return [Rollout.model_validate_json(r[0]) for r in self._query("SELECT body FROM rollouts ORDER BY id")]

    def max_id(self, model: str) -> int:
        """The highest rollout id of ``model`` (0 when none)."""
        rows = self._query("SELECT COALESCE(MAX(id), 0) FROM rollouts WHERE model = ?", (model,))
        return int(rows[0][0])

    def _execute(self, sql: str, args: tuple[object, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()
