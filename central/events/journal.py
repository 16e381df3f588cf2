"""Central's event log on disk (the ``events`` tables of ``central.sqlite3``, or PostgreSQL
with ``store.url``), so a restarted (or crashed) central still tells what happened before.

Write-behind: the loop hands each event over with ``add`` (a deque append, nothing
else) and a writer thread commits what has gathered every ``flush_interval_s``, or at
once when ``flush_max_events`` wait, in one transaction (on SQLite through a connection of
its own). A burst of 10,000 deaths costs ten commits, not 10,000, and the loop never waits
on a disk. A SIGKILL loses at most the events of the
last flush interval.

Pruning keeps the last ``kept`` rows and is batched too: one range ``DELETE`` once the
table has grown ``kept // 10`` (at least 100) rows past ``kept``.

Sequence numbers are not reused after a crash: the meta value ``reserved`` is kept at least
``RESERVE_AHEAD // 2`` ahead of every number written, and a start after a crash continues
after it (a visible gap says "events may be lost here"). Only a writer more than 50,000
events behind the loop could fall short of that. A clean close stores the last number
handed out, so a clean restart continues without a gap."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Literal

from central.storage.protocols import JournalDB, JournalRow
from fleetwire.mqtt.payloads import Event

log = logging.getLogger(__name__)

__all__ = ["RESERVE_AHEAD", "EventJournal", "PreviousStop"]

#: Sequence numbers reserved ahead of the last one written (see the module doc).
RESERVE_AHEAD = 100_000

#: How the central before this one ended: None when this journal is new.
PreviousStop = Literal["clean", "unclean"] | None


class EventJournal:
    """Write-behind copy of the event log (SQLite file or PostgreSQL); ``add`` is the only method
    the loop calls per event."""

    def __init__(
        self, db: JournalDB, kept: int, *, flush_interval_s: float = 0.1, flush_max_events: int = 1000
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
        self._db = db
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
        rows: list[JournalRow] = [(e.seq, e.ts, e.type, e.node_id, e.model_dump_json()) for e in batch]
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
