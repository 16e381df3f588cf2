"""Central's one SQLite file (``central.sqlite3`` in the data dir): the registry's versions, the
rollouts and release pointers, and the event journal, each store with its own tables.

The registry and rollout stores share one ``SQLiteDatabase`` (one connection, one re-entrant
lock), so ``transaction()`` can span both: a push's version and its activation (the model's
release pointer) commit together or not at all. The event journal's writer thread opens its
own connection to the same file (WAL: readers never wait on it), so a burst of events never
holds the lock the loop's store calls take."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["FILE_NAME", "SQLiteDatabase", "database"]

#: The file's name in central's data directory.
FILE_NAME = "central.sqlite3"

#: How long a write waits for another connection's write transaction (the journal's) to end.
_BUSY_TIMEOUT_MS = 10_000


class SQLiteDatabase:
    """One connection to one SQLite file (WAL, ``synchronous=FULL``), safe to call from worker
    threads. Stores sharing it count as users; the connection closes with the last one."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._depth = 0
        self._users = 0
        self._closed = False
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")

    def acquire(self) -> SQLiteDatabase:
        """Count one more store using this connection; returns self."""
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        """One store is done with the connection; the last one closes it."""
        with self._lock:
            self._users -= 1
            if self._users <= 0:
                self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed on exit, rolled back on an exception.
        Re-entrant: a transaction opened inside another (same thread) joins it, so a store's
        own transaction becomes part of a caller's that spans several stores."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # also when the COMMIT itself failed (a full disk)
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def execute(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        """One statement (its own transaction unless inside ``transaction()``)."""
        with self._lock:
            return self._conn.execute(sql, args)

    def query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def executescript(self, script: str) -> None:
        """Run several statements (schemas)."""
        with self._lock:
            self._conn.executescript(script)

    def columns(self, table: str) -> set[str]:
        """The column names of ``table`` (empty when it does not exist)."""
        return {row[1] for row in self.query(f"PRAGMA table_info({table})")}


def database(target: Path | SQLiteDatabase) -> SQLiteDatabase:
    """``target`` itself, or a new database on the file ``target``; counted as one more user."""
    return (target if isinstance(target, SQLiteDatabase) else SQLiteDatabase(target)).acquire()
