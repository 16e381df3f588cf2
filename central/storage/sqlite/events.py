"""The event journal's rows on SQLite: the ``events`` and ``events_meta`` tables of
``central.sqlite3``, written by the journal's writer thread on a connection of its own (WAL:
the loop's store calls never wait on a journal commit's lock, only SQLite's file lock)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from central.storage.protocols import JournalRow
from central.storage.sqlite.database import SQLiteDatabase, database

__all__ = ["SQLiteJournalDB"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    type TEXT NOT NULL,
    node_id TEXT,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events_meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class SQLiteJournalDB:
    """``JournalDB`` on SQLite."""

    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, target: Path | SQLiteDatabase) -> None:
        self._db = database(target)
        self._db.executescript(_SCHEMA)

    def load(self) -> tuple[dict[str, int], int, int]:
        """The meta values, the highest seq stored and the number of rows."""
        meta = {str(k): int(v) for k, v in self._db.query("SELECT key, value FROM events_meta")}
        max_seq, rows = self._db.query("SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM events")[0]
        return meta, int(max_seq), int(rows)

    def bodies(self, limit: int) -> list[str]:
        """The newest ``limit`` bodies, newest first."""
        return [r[0] for r in self._db.query("SELECT body FROM events ORDER BY seq DESC LIMIT ?", (limit,))]

    def write(self, rows: list[JournalRow], prune_to: int | None, meta: dict[str, int]) -> int | None:
        """Insert, maybe prune, store ``meta``: one ``BEGIN IMMEDIATE`` transaction."""
        with self._db.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO events (seq, ts, type, node_id, body) VALUES (?, ?, ?, ?, ?)", rows
            )
            left = self._prune(conn, prune_to) if prune_to is not None else None
            if meta:
                self.set_meta(meta)
        return left

    @staticmethod
    def _prune(conn: sqlite3.Connection, kept: int) -> int:
        """Drop every row but the newest ``kept`` (one range delete on the primary key); the rows left."""
        row = conn.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET ?", (kept - 1,)).fetchone()
        if row is None:  # fewer rows than counted (a replaced row)
            return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        conn.execute("DELETE FROM events WHERE seq < ?", (row[0],))
        return kept

    def set_meta(self, meta: dict[str, int]) -> None:
        """Upsert each key."""
        with self._db.transaction() as conn:
            conn.executemany(
                "INSERT INTO events_meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                list(meta.items()),
            )

    def close(self) -> None:
        """Done with the connection (closed with its last user)."""
        self._db.release()
