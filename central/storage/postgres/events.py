"""The event journal's rows on PostgreSQL (``store.url``): the ``events`` and ``events_meta``
tables of migration 0002. Same semantics as ``SQLiteJournalDB`` (insert-or-replace by seq,
one range delete to prune, meta upserts), each write one transaction on a pooled connection,
so a PostgreSQL restart costs a failed batch (counted in ``write_errors``), not the journal.

Replicas of a replicated central share the tables, each with its own rows (``replica``, its
id; "" for a single central): every replica numbers its own events."""

from __future__ import annotations

import psycopg

from central.storage.postgres.pool import open_pool
from central.storage.protocols import JournalRow

_UPSERT_META = (
    "INSERT INTO events_meta (replica, key, value) VALUES (%s, %s, %s)"
    " ON CONFLICT (replica, key) DO UPDATE SET value = excluded.value"
)


class PostgresJournalDB:
    """``JournalDB`` on PostgreSQL."""

    errors: tuple[type[Exception], ...] = (psycopg.Error,)

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, replica: str = "") -> None:
        self._replica = replica
        # One writer thread, plus a restore at start: two connections are plenty.
        self._pool, _ = open_pool(url, name="events", pool_size=2, connect_timeout_s=connect_timeout_s)

    def load(self) -> tuple[dict[str, int], int, int]:
        """The meta values, the highest seq stored and the number of rows."""
        with self._pool.connection() as conn:
            meta = {
                str(k): int(v)
                for k, v in conn.execute(
                    "SELECT key, value FROM events_meta WHERE replica = %s", (self._replica,)
                ).fetchall()
            }
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM events WHERE replica = %s", (self._replica,)
            ).fetchone()
        assert row is not None
        return meta, int(row[0]), int(row[1])

    def bodies(self, limit: int) -> list[str]:
        """The newest ``limit`` bodies, newest first."""
        with self._pool.connection() as conn:
            return [
                r[0]
                for r in conn.execute(
                    "SELECT body FROM events WHERE replica = %s ORDER BY seq DESC LIMIT %s", (self._replica, limit)
                )
            ]

    def write(self, rows: list[JournalRow], prune_to: int | None, meta: dict[str, int]) -> int | None:
        """Insert, maybe prune, store ``meta``: one transaction."""
        left: int | None = None
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO events (replica, seq, ts, type, node_id, body) VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (replica, seq) DO UPDATE SET ts = excluded.ts, type = excluded.type,"
                " node_id = excluded.node_id, body = excluded.body",
                [(self._replica, *row) for row in rows],
            )
            if prune_to is not None:
                cur.execute(
                    "SELECT seq FROM events WHERE replica = %s ORDER BY seq DESC LIMIT 1 OFFSET %s",
                    (self._replica, prune_to - 1),
                )
                edge = cur.fetchone()
                if edge is None:  # fewer rows than counted (a replaced row)
                    cur.execute("SELECT COUNT(*) FROM events WHERE replica = %s", (self._replica,))
                    counted = cur.fetchone()
                    left = int(counted[0]) if counted else 0
                else:
                    cur.execute("DELETE FROM events WHERE replica = %s AND seq < %s", (self._replica, edge[0]))
                    left = prune_to
            if meta:
                cur.executemany(_UPSERT_META, [(self._replica, k, v) for k, v in meta.items()])
        return left

    def set_meta(self, meta: dict[str, int]) -> None:
        """Upsert each key."""
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.executemany(_UPSERT_META, [(self._replica, k, v) for k, v in meta.items()])

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()
