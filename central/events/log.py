"""Central's fleet-wide event log: every event (membership transitions, pushes, rollouts,
drift, operator actions) numbered and kept in a ring buffer, journaled to disk
(``EventJournal``) and handed to a publisher (MQTT). Emitters call ``EventLog.record``."""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from central.events.journal import EventJournal
from fleetwire.mqtt.payloads import Event

log = logging.getLogger(__name__)

__all__ = ["EventLog", "operator_event"]


def operator_event(event_type: str, actor: str, detail: Mapping[str, object]) -> Event:
    """An event an operator's request caused (``model_pushed``, ``version_deleted``), with who asked."""
    return Event(type=event_type, ts=int(time.time() * 1000), detail=dict(detail), actor=actor)


class EventLog:
    """The last ``kept`` events, oldest first, each numbered (``seq``); an optional
    ``journal`` keeps them on disk and an optional publisher sends each one out.

    With a journal, the log starts with the events the journal restored and numbering
    goes on where it left off."""

    def __init__(
        self, kept: int, publisher: Callable[[Event], None] | None = None, journal: EventJournal | None = None
    ) -> None:
        self._events: deque[Event] = deque(maxlen=kept)
        self.publisher = publisher
        self.journal = journal
        self._next_seq = 1
        if journal is not None:
            self._events.extend(journal.restore())
            self._next_seq = journal.next_seq

    def append(self, event: Event) -> Event:
        """Keep ``event`` with the next ``seq``, dropping the oldest once full; returns it numbered."""
        event = event.model_copy(update={"seq": self._next_seq})
        self._next_seq += 1
        self._events.append(event)
        if self.journal is not None:
            self.journal.add(event)
        return event

    def record(self, event: Event) -> None:
        """Keep (numbered) and publish an event: what every emitter (pushes, rollouts, drift,
        operator actions, start-up) calls, beside the membership transitions."""
        self.publish(self.append(event))

    def publish(self, event: Event) -> None:
        """Hand ``event`` to the publisher, if any; its failures are logged, not raised."""
        if self.publisher is not None:
            try:
                self.publisher(event)
            except Exception:
                log.exception("event publisher failed")

    def last(self, limit: int | None = None) -> list[Event]:
        """The last ``limit`` events (all kept when None), oldest first."""
        if limit is None or limit >= len(self._events):
            return list(self._events)
        if limit <= 0:
            return []
        return list(itertools.islice(self._events, len(self._events) - limit, None))

    def since(self, seq: int, limit: int) -> list[Event]:
        """Up to ``limit`` kept events numbered above ``seq``, oldest first (a page: pass the
        last one's ``seq`` to get the next)."""
        start = bisect.bisect_right(self._events, seq, key=_seq_of)
        return list(itertools.islice(self._events, start, start + max(0, limit)))


def _seq_of(event: Event) -> int:
    return event.seq or 0
