"""Heartbeats' live shadow counts between replicas (``shadow_counts``, migration 0005): the
replica that hears a node's heartbeats (its partition's owner) writes the node's latest
counts; the leader, which judges drift and pending INT8 over every node pooled, reads what
changed since it last looked.

Each write takes one transaction-scoped advisory lock before it numbers its rows
(``shadow_counts_seq``), so rows are numbered in commit order and a reader that asks for
``seq > last`` never skips a row committed late with a smaller number."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from central.storage.postgres.pool import open_pool
from central.storage.protocols import ShadowCountRow

__all__ = ["PostgresShadowCounts"]

_log = logging.getLogger(__name__)

#: The advisory lock every counts write takes ("mflt" "shdw").
_LOCK_KEY = 0x6D666C74_73686477
_UPSERT = (
    "INSERT INTO shadow_counts (kind, model, version, candidate, node_id, artifact, raw, at, seq)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, nextval('shadow_counts_seq'))"
    " ON CONFLICT (kind, model, version, candidate, node_id) DO UPDATE SET artifact = EXCLUDED.artifact,"
    " raw = EXCLUDED.raw, at = EXCLUDED.at, seq = EXCLUDED.seq"
)
_COLUMNS = "model, version, candidate, node_id, artifact, raw, at, seq"

Key = tuple[str, str, str, str, str]


class PostgresShadowCounts:
    """``ShadowCounts`` on PostgreSQL; ``put`` only buffers, ``flush`` writes one transaction."""

    def __init__(self, url: str, *, pool_size: int = 2, connect_timeout_s: float = 10.0) -> None:
        self._pool, _ = open_pool(url, name="shadow-counts", pool_size=pool_size, connect_timeout_s=connect_timeout_s)
        self._lock = threading.Lock()
        self._pending: dict[Key, ShadowCountRow] = {}
        self._seen: dict[str, int] = {}
        self.write_errors = 0

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def put(self, kind: str, rows: Iterable[ShadowCountRow]) -> None:
        """Buffer the latest counts of each (version, candidate, node)."""
        with self._lock:
            for r in rows:
                self._pending[(kind, r.model, r.version, r.candidate, r.node_id)] = r

    def flush(self) -> None:
        """Write the buffered rows; on failure keep them (newer ones put meanwhile win)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        rows = [
            (k[0], r.model, r.version, r.candidate, r.node_id, r.artifact, Jsonb(r.raw), r.at)
            for k, r in pending.items()
        ]
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                with conn.cursor() as cur:
                    cur.executemany(_UPSERT, rows)
        except Exception as exc:
            self.write_errors += 1
            _log.warning("shadow counts not written (%s); retrying at the next flush", exc)
            with self._lock:
                for key, row in pending.items():
                    self._pending.setdefault(key, row)

    def changed(self, kind: str) -> list[ShadowCountRow]:
        """Rows of ``kind`` written since the last call (all of them at the first)."""
        since = self._seen.get(kind, 0)
        with self._pool.connection() as conn:
            found: list[tuple[Any, ...]] = conn.execute(
                f"SELECT {_COLUMNS} FROM shadow_counts WHERE kind = %s AND seq > %s ORDER BY seq", (kind, since)
            ).fetchall()
        if found:
            self._seen[kind] = int(found[-1][7])
        return [
            ShadowCountRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), dict(r[5]), float(r[6]))
            for r in found
        ]
