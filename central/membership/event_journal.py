"""Central's event log on disk: ``events.sqlite3`` in the data directory, so a restarted
(or crashed) central still tells what happened before.

Write-behind: the loop hands each event over with ``add`` (a deque append, nothing
else) and a writer thread commits what has gathered every ``flush_interval_s``, or at
once when ``flush_max_events`` wait, in one transaction (WAL, one connection, like the
registry's and the rollouts' stores). A burst of 10,000 deaths costs ten commits, not
10,000, and the loop never waits on a disk. A SIGKILL loses at most the events of the
last flush interval.

Pruning keeps the last ``kept`` rows and is batched too: one range ``DELETE`` once the
table has grown ``kept // 10`` (at least 100) rows past ``kept``.

Sequence numbers are not reused after a crash: ``meta.reserved`` is kept at least
``RESERVE_AHEAD // 2`` ahead of every number written, and a start after a crash continues
after it (a visible gap says "events may be lost here"). Only a writer more than 50,000
events behind the loop could fall short of that. A clean close stores the last number
handed out, so a clean restart continues without a gap."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from pathlib import Path
from typing import Literal, Protocol

from fleetwire.mqtt.payloads import Event

log = logging.getLogger(__name__)

__all__ = ["RESERVE_AHEAD", "EventJournal", "JournalDB", "PreviousStop", "SQLiteJournalDB"]

#: Sequence numbers reserved ahead of the last one written (see the module doc).
RESERVE_AHEAD = 100_000

#: How the central before this one ended: None when this journal is new.
PreviousStop = Literal["clean", "unclean"] | None

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    type TEXT NOT NULL,
    node_id TEXT,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


#: One row of ``events``: seq, ts, type, node_id, body (the event as JSON).
Row = tuple[int | None, int, str, str | None, str]


class JournalDB(Protocol):
    """Where the journal's rows live: SQLite (``SQLiteJournalDB``) or PostgreSQL. Called from one
    thread at a time (the journal holds its lock); each method is one transaction."""

    #: What a failed read or write raises (the journal counts a failed write and goes on).
    errors: tuple[type[Exception], ...]

    def load(self) -> tuple[dict[str, int], int, int]:
        """The meta values, the highest seq stored (0 when none) and the number of rows."""
        ...

    def bodies(self, limit: int) -> list[str]:
        """The bodies of the newest ``limit`` events, newest first."""
        ...

    def write(self, rows: list[Row], prune_to: int | None, meta: dict[str, int]) -> int | None:
        """Insert (or replace) ``rows``; when ``prune_to`` is set, drop all but the newest
        ``prune_to`` rows and return the rows left; store ``meta``. All in one transaction."""
        ...

    def set_meta(self, meta: dict[str, int]) -> None:
        """Store ``meta`` (key -> value)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class SQLiteJournalDB:
    """``events.sqlite3``: WAL, one connection, like the registry's and the rollouts' stores."""

    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def load(self) -> tuple[dict[str, int], int, int]:
        """The meta values, the highest seq stored and the number of rows."""
        meta = {str(k): int(v) for k, v in self._db.execute("SELECT key, value FROM meta").fetchall()}
        max_seq, rows = self._db.execute("SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM events").fetchone()
        return meta, int(max_seq), int(rows)

    def bodies(self, limit: int) -> list[str]:
        """The newest ``limit`` bodies, newest first."""
        return [r[0] for r in self._db.execute("SELECT body FROM events ORDER BY seq DESC LIMIT ?", (limit,))]

    def write(self, rows: list[Row], prune_to: int | None, meta: dict[str, int]) -> int | None:
        """Insert, maybe prune, store ``meta``: one ``BEGIN IMMEDIATE`` transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                "INSERT OR REPLACE INTO events (seq, ts, type, node_id, body) VALUES (?, ?, ?, ?, ?)", rows
            )
            left = self._prune(prune_to) if prune_to is not None else None
            if meta:
                self.set_meta(meta)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return left

    def _prune(self, kept: int) -> int:
        """Drop every row but the newest ``kept`` (one range delete on the primary key); the rows left."""
        row = self._db.execute("SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET ?", (kept - 1,)).fetchone()
        if row is None:  # fewer rows than counted (a replaced row)
            return int(self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        self._db.execute("DELETE FROM events WHERE seq < ?", (row[0],))
        return kept

    def set_meta(self, meta: dict[str, int]) -> None:
        """Upsert each key."""
        self._db.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            list(meta.items()),
        )

    def close(self) -> None:
        """Close the file."""
        self._db.close()


class EventJournal:
    """Write-behind copy of the event log (SQLite file or PostgreSQL); ``add`` is the only method
    the loop calls per event."""

    def __init__(
        self, target: Path | JournalDB, kept: int, *, flush_interval_s: float = 0.1, flush_max_events: int = 1000
    ) -> None:
        self.kept = kept
        self.flush_interval_s = flush_interval_s
        self.flush_max_events = flush_max_events
        self.write_errors = 0
        self._slack = max(kept // 10, 100)
        self._pending: deque[Event] = deque()
        self._last_added = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._db: JournalDB = SQLiteJournalDB(target) if isinstance(target, Path) else target
        self.previous_stop, self._last_seq, self._rows = self._open()
        self._thread = threading.Thread(target=self._run, name="event-journal", daemon=True)
        self._thread.start()

    def _open(self) -> tuple[PreviousStop, int, int]:
        """Read how the last run ended and where numbering goes on; reserve ahead."""
        meta, max_seq, rows = self._db.load()
        previous: PreviousStop = None
        if meta:
            previous = "clean" if meta.get("clean") == 1 else "unclean"
        last = max(max_seq, meta.get("reserved", 0))
        self._reserved = last + RESERVE_AHEAD
        self._db.set_meta({"reserved": self._reserved, "clean": 0})
        return previous, last, rows

    @property
    def next_seq(self) -> int:
        """The number the next event gets (read once, before the first ``add``)."""
        return self._last_seq + 1

    def restore(self) -> list[Event]:
        """The last ``kept`` events stored, oldest first."""
        with self._lock:
            bodies = self._db.bodies(self.kept)
        events = []
        for body in reversed(bodies):
            try:
                events.append(Event.model_validate_json(body))
            except ValueError:
                log.warning("skipping an unreadable event in the event log: %.200s", body)
        return events

    def add(self, event: Event) -> None:
        """Queue ``event`` (it has its ``seq``) for the next write; wakes the writer in a burst."""
        self._pending.append(event)
        self._last_added = event.seq or self._last_added
        if len(self._pending) >= self.flush_max_events:
            self._wake.set()

    def flush(self) -> None:
        """Write what is queued now (the writer thread does this by itself)."""
        batch: list[Event] = []
        while self._pending:
            batch.append(self._pending.popleft())
        if batch:
            try:
                self._write(batch)
            except self._db.errors:
                self.write_errors += 1
                log.exception("could not write %d events to the event log", len(batch))

    def close(self) -> None:
        """Write what is left, remember a clean stop, close the store."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        self._thread.join()
        self.flush()
        with self._lock:
            try:  # even numbers whose write failed were handed out: never again
                self._db.set_meta({"reserved": max(self._last_seq, self._last_added), "clean": 1})
            except self._db.errors:
                log.exception("could not mark the event log closed; the next start counts it as unclean")
            self._db.close()

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()

    def _write(self, batch: list[Event]) -> None:
        rows: list[Row] = [(e.seq, e.ts, e.type, e.node_id, e.model_dump_json()) for e in batch]
        last = max(int(e.seq or 0) for e in batch)
        with self._lock:
            total = self._rows + len(rows)
            prune_to = self.kept if total > self.kept + self._slack else None
            reserved = self._reserved
            meta: dict[str, int] = {}
            if last + RESERVE_AHEAD // 2 > reserved:
                reserved = last + RESERVE_AHEAD
                meta["reserved"] = reserved
            left = self._db.write(rows, prune_to, meta)
            self._rows = total if left is None else left
            self._reserved = reserved
            self._last_seq = max(self._last_seq, last)
