"""Telling the world about membership transitions: an event in the fleet's event log, a log
line, and the listeners' callbacks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from central.events.log import EventLog
from central.membership.liveness import REASON_TIMEOUT, Listener, NodeLiveness, TransitionInfo
from central.membership.node_state import TrackedNode
from fleetwire.mqtt.payloads import Event

#: The tracker's logger, so that logging configuration keyed on it still covers these lines.
log = logging.getLogger("central.membership.tracker")

__all__ = ["EVENT_TYPES", "Notifier", "transition_event"]

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
