"""Telling the world about membership transitions: events (built from a transition, numbered
and kept in a ring buffer, journaled to disk, handed to a publisher), a log line, and the
listeners' callbacks. Rollout and operator events go through the same log."""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from central.membership.event_journal import EventJournal
from central.membership.liveness import REASON_TIMEOUT, Listener, NodeLiveness, TransitionInfo
from central.membership.node_state import TrackedNode
from fleetwire.mqtt.payloads import Event

#: The tracker's logger, so that logging configuration keyed on it still covers these lines.
log = logging.getLogger("central.membership.tracker")

__all__ = ["EVENT_TYPES", "EventLog", "Notifier", "operator_event", "transition_event"]

EVENT_TYPES = {
    NodeLiveness.ALIVE: "node_alive",
    NodeLiveness.SUSPECT: "node_suspect",
    NodeLiveness.DEAD: "node_dead",
}


def transition_event(
    node: TrackedNode,
    old: NodeLiveness | None,
    new: NodeLiveness,
    reason: str,
    *,
    silent_s: float,
    retained: bool,
) -> Event:
    """The event for ``node`` moving from ``old`` to ``new``. ``silent_s`` (how long
    nothing was heard) is reported for timeouts only."""
    event_type = "node_rejoined" if old is NodeLiveness.DEAD and new is NodeLiveness.ALIVE else EVENT_TYPES[new]
    detail: dict[str, object] = {"reason": reason, "previous": old.value if old else None, "bdseq": node.bdseq}
    if reason == REASON_TIMEOUT:
        detail["silent_s"] = round(silent_s, 3)
        detail["interval_s"] = node.interval_s
    if retained:
        detail["retained"] = True
    return Event(type=event_type, ts=int(time.time() * 1000), node_id=node.node_id, detail=detail)


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


class Notifier:
    """Announces transitions: to ``events`` (kept, published) and to every listener."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self._listeners: list[Listener] = []

    @property
    def has_listeners(self) -> bool:
        """Whether anyone listens (so a notification is worth building)."""
        return bool(self._listeners)

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` on every notification; returns an unsubscribe."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def transition(
        self, node: TrackedNode, old: NodeLiveness | None, reason: str, *, now: float, silent_s: float, retained: bool
    ) -> None:
        """``node`` has just moved from ``old`` to its current state, at ``now``."""
        new = node.state
        event = self.events.append(transition_event(node, old, new, reason, silent_s=silent_s, retained=retained))
        level = logging.INFO if new is NodeLiveness.ALIVE else logging.WARNING
        log.log(level, "%s %s: %s", event.type, node.node_id, reason)
        self.events.publish(event)
        self.emit(node.node_id, old, new, TransitionInfo(reason, node.view(now), event))

    def emit(self, node_id: str, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
        """Call every listener; their failures are logged, not raised."""
        for callback in list(self._listeners):
            try:
                callback(node_id, old, new, info)
            except Exception:
                log.exception("membership listener failed for %s", node_id)
