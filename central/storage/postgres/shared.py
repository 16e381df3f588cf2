"""One transaction across central's PostgreSQL stores. Each store keeps its own pool; while a
thread holds a ``SharedTransaction`` open, every store that shares it runs that thread's
statements on the transaction's connection instead of borrowing its own, so a push's version
(registry) and its activation (the release pointer, rollouts) commit together, as on SQLite."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

__all__ = ["SharedTransaction"]


class SharedTransaction:
    """The open transaction of each thread (none by default), shared by the stores of one storage."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _current(self) -> psycopg.Connection[Any] | None:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        return conn

    def active(self) -> bool:
        """Whether this thread holds a transaction open."""
        return self._current() is not None

    @contextmanager
    def transaction(self, pool: ConnectionPool[Any]) -> Iterator[None]:
        """Open one transaction on a connection of ``pool`` for this thread (or join the open one)."""
        if self._current() is not None:
            yield
            return
        with pool.connection() as conn, conn.transaction():
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def connection(self, pool: ConnectionPool[Any]) -> Iterator[psycopg.Connection[Any]]:
        """This thread's transaction's connection, else one borrowed from ``pool``."""
        conn = self._current()
        if conn is not None:
            yield conn
            return
        with pool.connection() as borrowed:
            yield borrowed
