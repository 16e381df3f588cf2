"""The values the membership tracker hands out: states, snapshots, transitions, counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from fleetwire.mqtt.payloads import CacheInfo, Event, LoadInfo, ModelInfo

__all__ = [
    "REASON_ADDRESSES",
    "REASON_BIRTH",
    "REASON_CLEAN",
    "REASON_HEARTBEAT",
    "REASON_TIMEOUT",
    "REASON_WILL",
    "Listener",
    "NodeLiveness",
    "NodeView",
    "TrackerCounters",
    "TransitionInfo",
]

#: Reasons used in events and ``TransitionInfo.reason``.
REASON_TIMEOUT = "heartbeat timeout"
REASON_WILL = "last will"
REASON_CLEAN = "clean shutdown"
REASON_BIRTH = "birth"
REASON_HEARTBEAT = "heartbeat"
REASON_ADDRESSES = "addresses changed"


class NodeLiveness(StrEnum):
    """Central's view of a node."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class NodeView:
    """A snapshot of one node. Times are ``loop.time()`` (monotonic) seconds."""

    node_id: str
    state: NodeLiveness
    last_heartbeat_at: float | None
    last_heartbeat_age_s: float | None
    bdseq: int
    interval_s: float
    grpc_address: str
    http_address: str
    models: list[ModelInfo]
    load: LoadInfo | None
    reported_state: str | None
    state_since: float
    #: The chunk cache as of the last heartbeat (None before the first).
    cache: CacheInfo | None = None
    #: The hardware class the last heartbeat names ("" before one, or from older edges).
    hardware_class: str = ""
    #: ``synced`` or ``autonomous`` as the last heartbeat says ("" before one).
    mode: str = ""
    #: Since when the node runs without central (Unix ms), from the last heartbeat.
    autonomous_since_ms: int | None = None
    #: Central's clock minus the node's and that figure's error bound (ms), as the node measured
    #: them (None: unknown).
    clock_offset_ms: float | None = None
    clock_error_ms: float | None = None


@dataclass(frozen=True, slots=True)
class TransitionInfo:
    """What listeners get with a transition.

    ``event`` is None for a notification without a state change (``old == new``): the
    node's advertised addresses changed (``reason == "addresses changed"``)."""

    reason: str
    view: NodeView
    event: Event | None


#: ``callback(node_id, old_state, new_state, info)``; ``old_state`` None = first seen.
Listener = Callable[[str, NodeLiveness | None, NodeLiveness, TransitionInfo], None]


@dataclass
class TrackerCounters:
    """Monotonic counters. ``malformed_dropped`` and ``oversized_dropped`` are written by
    the MQTT consumer on paho's thread (its only writer), the rest on the loop."""

    heartbeats_processed: int = 0
    statuses_processed: int = 0
    malformed_dropped: int = 0
    oversized_dropped: int = 0
    stale_deaths_ignored: int = 0
    stale_heartbeats_ignored: int = 0
    stale_births_ignored: int = 0
    bdseq_resets: int = 0
    #: Births and heartbeats whose bdseq was too far ahead of a live node's session.
    bdseq_ahead_ignored: int = 0
    transitions: int = 0

    def as_dict(self) -> dict[str, int]:
        """Name → value."""
        return dict(self.__dict__)
