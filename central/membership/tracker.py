"""Liveness of edge nodes from their MQTT births, deaths and heartbeats.

Pure logic on one asyncio loop: the MQTT consumer parses messages on paho's thread and
hands them over with ``call_soon_threadsafe``; nothing here touches the network, so it is
unit-testable with a real loop and small intervals.

States: ``alive`` → ``suspect`` (nothing heard for ``suspect_after`` × the node's declared
``interval_s``) → ``dead`` (``dead_after`` ×, or an ``offline`` status whose ``bdseq`` is
the one of the latest birth). An ``offline`` with an older ``bdseq`` is the Last Will of a
session that has already been superseded, and is ignored.

Timers: one ``loop.call_at`` handle per node, re-armed lazily. A heartbeat only stores the
time it arrived (a few attribute writes); when a node's timer fires it recomputes the
deadline from the latest heartbeat and either re-arms for it or moves the node on. So a
node that beats every second costs one timer callback every ``suspect_after`` seconds, no
heap operation per heartbeat, and there is never a scan over all nodes.

Grace: deadlines are counted from the later of the node's last sign of life and the last
time central's broker link came up (``link_up``; the tracker's creation counts as one).
Nodes learned from retained births when central (re)starts, or when its consumer
reconnects after a broker outage, therefore get a full window to send a fresh heartbeat
before they can be declared suspect or dead; while the link is down no timer moves a node
on at all (central cannot hear anyone, which says nothing about them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from fleetwire.mqtt.payloads import Event, Heartbeat, LoadInfo, ModelInfo, NodeStatus

log = logging.getLogger(__name__)

__all__ = [
    "Listener",
    "MembershipTracker",
    "NodeLiveness",
    "NodeView",
    "TrackerCounters",
    "TransitionInfo",
]

#: Timer callbacks may run up to the loop's clock resolution early; uvloop counts in ms.
_EARLY_S = 0.001

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


_EVENT_TYPES = {
    NodeLiveness.ALIVE: "node_alive",
    NodeLiveness.SUSPECT: "node_suspect",
    NodeLiveness.DEAD: "node_dead",
}


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
    transitions: int = 0

    def as_dict(self) -> dict[str, int]:
        """Name → value."""
        return dict(self.__dict__)


_NO_KEYS: frozenset[tuple[str, str]] = frozenset()


class _Node:
    __slots__ = (
        "bdseq",
        "birth_ts",
        "dead_bdseq",
        "grpc_address",
        "heartbeat",
        "http_address",
        "interval_s",
        "last_heartbeat_at",
        "node_id",
        "ready_keys",
        "seen_at",
        "since",
        "state",
        "timer",
        "timer_at",
    )

    def __init__(self, node_id: str, bdseq: int, interval_s: float, now: float) -> None:
        self.node_id = node_id
        self.state = NodeLiveness.ALIVE
        self.since = now
        self.bdseq = bdseq
        #: bdseq of the session an offline status ended; None when it died by timeout.
        self.dead_bdseq: int | None = None
        self.birth_ts = 0
        self.interval_s = interval_s
        #: Last sign of life (heartbeat or fresh birth), loop time.
        self.seen_at = now
        self.last_heartbeat_at: float | None = None
        self.heartbeat: Heartbeat | None = None
        self.grpc_address = ""
        self.http_address = ""
        #: (model, version) pairs the last heartbeat reports ``ready``; mirrored in the index.
        self.ready_keys: frozenset[tuple[str, str]] = _NO_KEYS
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0


class MembershipTracker:
    """Liveness state machine for every node that ever announced itself over MQTT.

    All methods except the two drop counters must run on ``loop``'s thread."""

    def __init__(
        self,
        *,
        suspect_after: float = 2.0,
        dead_after: float = 3.0,
        default_interval_s: float = 5.0,
        events_kept: int = 500,
        publisher: Callable[[Event], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """``default_interval_s`` is assumed for a node until its first heartbeat
        declares its own ``interval_s`` (a birth carries none).

        Runs on ``loop``, else the loop running at construction, else the one running at
        the first call (so it can be built outside a loop, e.g. in ``Central.__init__``)."""
        if not 0 < suspect_after <= dead_after:
            raise ValueError("need 0 < suspect_after <= dead_after")
        if default_interval_s <= 0:
            raise ValueError("default_interval_s must be > 0")
        if events_kept < 1:
            raise ValueError("events_kept must be >= 1")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.suspect_after = float(suspect_after)
        self.dead_after = float(dead_after)
        self.default_interval_s = float(default_interval_s)
        self.counters = TrackerCounters()
        self._nodes: dict[str, _Node] = {}
        self._events: deque[Event] = deque(maxlen=events_kept)
        #: model → version → ids of nodes whose last heartbeat reports it ready (any state).
        self._ready_index: dict[str, dict[str, set[str]]] = {}
        self._listeners: list[Listener] = []
        self._publisher = publisher
        self._link_up = True
        self._grace_from = float("-inf")
        if loop is None:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
        if loop is not None:
            self._bind(loop)
        self._frozen: set[str] = set()
        self._closed = False

    # ----------------------------------------------------------------- wiring

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        self._loop = loop
        self._grace_from = loop.time()  # binding counts as the first link-up
        return loop

    def _ev(self) -> asyncio.AbstractEventLoop:
        """The loop: given, running at construction, or the one of the first call."""
        loop = self._loop
        return loop if loop is not None else self._bind(asyncio.get_running_loop())

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` on every transition (on the loop); returns an unsubscribe."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    def set_publisher(self, publisher: Callable[[Event], None] | None) -> None:
        """Hand every event to ``publisher`` as well (e.g. the MQTT events topic)."""
        self._publisher = publisher

    @property
    def link_is_up(self) -> bool:
        """Whether central currently hears the broker."""
        return self._link_up

    def link_down(self) -> None:
        """Central lost its broker connection: freeze every timeout until ``link_up``."""
        self._link_up = False

    def link_up(self) -> None:
        """Central (re)connected: every node gets a full window from now."""
        self._link_up = True
        self._grace_from = self._ev().time()
        frozen, self._frozen = self._frozen, set()
        for node_id in frozen:
            node = self._nodes.get(node_id)
            if node is not None and node.state is not NodeLiveness.DEAD:
                self._arm(node, self._next_deadline(node))

    def close(self) -> None:
        """Cancel every timer; the tracker stops moving nodes on."""
        self._closed = True
        for node in self._nodes.values():
            if node.timer is not None:
                node.timer.cancel()
                node.timer = None

    # ----------------------------------------------------------------- input

    def on_heartbeat(self, node_id: str, hb: Heartbeat) -> None:
        """A heartbeat from ``node_id`` (already checked to match ``hb.node_id``)."""
        self.counters.heartbeats_processed += 1
        now = self._ev().time()
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id, hb.bdseq, hb.interval_s, now)
            self._store_heartbeat(node, hb, now)
            self._transition(node, None, NodeLiveness.ALIVE, REASON_HEARTBEAT)
            self._arm(node, self._next_deadline(node))
            return
        if hb.bdseq < node.bdseq or (node.dead_bdseq is not None and hb.bdseq <= node.dead_bdseq):
            # From a session that has been superseded or has ended with an offline status.
            self.counters.stale_heartbeats_ignored += 1
            return
        node.bdseq = hb.bdseq
        shorter = hb.interval_s < node.interval_s
        addresses = hb.grpc_address != node.grpc_address or hb.http_address != node.http_address
        self._store_heartbeat(node, hb, now)
        state = node.state
        if state is NodeLiveness.ALIVE:
            if shorter or node.timer is None:
                self._arm(node, self._next_deadline(node))
            if addresses:
                self._notify_same(node, REASON_ADDRESSES)
            return
        node.dead_bdseq = None
        self._transition(node, state, NodeLiveness.ALIVE, REASON_HEARTBEAT)
        self._arm(node, self._next_deadline(node))

    def on_status(self, node_id: str, status: NodeStatus, retained: bool = False) -> None:
        """A birth (``online``) or death (``offline``) on ``node_id``'s status topic."""
        self.counters.statuses_processed += 1
        if status.state == "online":
            self._on_birth(node_id, status, retained)
        else:
            self._on_death(node_id, status, retained)

    def _on_birth(self, node_id: str, status: NodeStatus, retained: bool) -> None:
        now = self._ev().time()
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id, status.bdseq, self.default_interval_s, now)
            node.birth_ts = status.ts
            self._transition(node, None, NodeLiveness.ALIVE, REASON_BIRTH, retained=retained)
            self._arm(node, self._next_deadline(node))
            return
        if status.bdseq == node.bdseq:
            # The same birth again (retained redelivery on resubscribe, QoS 1 duplicate):
            # not a fresh sign of life.
            node.birth_ts = max(node.birth_ts, status.ts)
            return
        if status.bdseq < node.bdseq:
            if status.ts <= node.birth_ts:
                self.counters.stale_births_ignored += 1
                return
            # A later birth with a smaller bdseq: the node restarted with its counter reset.
            self.counters.bdseq_resets += 1
        node.bdseq = status.bdseq
        node.birth_ts = status.ts
        node.dead_bdseq = None
        node.seen_at = now
        old = node.state
        if old is not NodeLiveness.ALIVE:
            self._transition(node, old, NodeLiveness.ALIVE, REASON_BIRTH, retained=retained)
        self._arm(node, self._next_deadline(node))

    def _on_death(self, node_id: str, status: NodeStatus, retained: bool) -> None:
        node = self._nodes.get(node_id)
        if node is None:
            # Never seen alive (typically a retained death at start-up): remember it, quietly.
            node = self._nodes[node_id] = _Node(node_id, status.bdseq, self.default_interval_s, self._ev().time())
            node.state = NodeLiveness.DEAD
            node.dead_bdseq = status.bdseq
            return
        stale = status.bdseq < node.bdseq or (status.bdseq > node.bdseq and status.ts < node.birth_ts)
        if stale:
            # The Last Will of a superseded session; or, after a bdseq reset, the will of
            # the session before the reset (a larger bdseq, stamped before the current birth).
            self.counters.stale_deaths_ignored += 1
            return
        node.bdseq = status.bdseq
        node.dead_bdseq = status.bdseq
        if node.state is NodeLiveness.DEAD:
            return
        # A Last Will is composed at connect time, so it is stamped no later than the birth
        # and the heartbeats of its session; a clean offline is stamped at shutdown.
        last_ts = max(node.birth_ts, node.heartbeat.ts if node.heartbeat is not None else 0)
        reason = REASON_WILL if status.ts <= last_ts else REASON_CLEAN
        self._cancel(node)
        self._transition(node, node.state, NodeLiveness.DEAD, reason, retained=retained)

    # ----------------------------------------------------------------- queries

    def get(self, node_id: str) -> NodeView | None:
        """One node, or None."""
        node = self._nodes.get(node_id)
        return None if node is None else self._view(node, self._ev().time())

    def nodes(self) -> list[NodeView]:
        """Every known node (dead ones too), by id."""
        now = self._ev().time()
        return [self._view(self._nodes[k], now) for k in sorted(self._nodes)]

    def state_of(self, node_id: str) -> NodeLiveness | None:
        """The state of one node, or None (cheaper than ``get``)."""
        node = self._nodes.get(node_id)
        return None if node is None else node.state

    def counts(self) -> dict[str, int]:
        """Number of nodes per state."""
        out = {s.value: 0 for s in NodeLiveness}
        for node in self._nodes.values():
            out[node.state.value] += 1
        return out

    def ready_nodes(self, model: str, version: str | None = None) -> list[NodeView]:
        """Alive nodes whose last heartbeat lists ``model`` (at ``version``; None = any)
        in state ``ready``, by id. Served from an index: cost follows the answer's size."""
        now = self._ev().time()
        return [self._view(self._nodes[node_id], now) for node_id in sorted(self._ready_ids(model, version))]

    def ready_endpoints(self, model: str, version: str | None = None) -> list[tuple[str, str]]:
        """(node id, http address) of ``ready_nodes``, unsorted and without building views:
        cheap enough for a gateway to call on every request."""
        nodes = self._nodes
        return [(node_id, nodes[node_id].http_address) for node_id in self._ready_ids(model, version)]

    def _ready_ids(self, model: str, version: str | None) -> list[str]:
        by_version = self._ready_index.get(model)
        if not by_version:
            return []
        if version is not None:
            ids: Iterable[str] = by_version.get(version, ())
        elif len(by_version) == 1:
            ids = next(iter(by_version.values()))
        else:
            ids = set().union(*by_version.values())
        nodes = self._nodes
        alive = NodeLiveness.ALIVE
        return [node_id for node_id in ids if nodes[node_id].state is alive]

    def events(self, limit: int | None = None) -> list[Event]:
        """The last ``limit`` events (all kept when None), oldest first."""
        if limit is None or limit >= len(self._events):
            return list(self._events)
        if limit <= 0:
            return []
        return list(self._events)[-limit:]

    def forget(self, node_id: str) -> bool:
        """Drop a dead node's record (a decommissioned node); False if unknown or not dead."""
        node = self._nodes.get(node_id)
        if node is None or node.state is not NodeLiveness.DEAD:
            return False
        self._cancel(node)
        self._reindex(node, _NO_KEYS)
        del self._nodes[node_id]
        return True

    # Called by the consumer on paho's thread; plain int increments with a single writer.
    def count_malformed(self) -> None:
        """One message dropped because it did not parse or did not match its topic."""
        self.counters.malformed_dropped += 1

    def count_oversized(self) -> None:
        """One message dropped unread because it exceeded ``MAX_PAYLOAD_BYTES``."""
        self.counters.oversized_dropped += 1

    # ----------------------------------------------------------------- internals

    def _store_heartbeat(self, node: _Node, hb: Heartbeat, now: float) -> None:
        node.heartbeat = hb
        node.last_heartbeat_at = now
        node.seen_at = now
        node.interval_s = hb.interval_s
        node.grpc_address = hb.grpc_address
        node.http_address = hb.http_address
        models = hb.models
        keys = frozenset([(m.name, m.version) for m in models if m.state == "ready"]) if models else _NO_KEYS
        if keys != node.ready_keys:
            self._reindex(node, keys)

    def _reindex(self, node: _Node, keys: frozenset[tuple[str, str]]) -> None:
        index = self._ready_index
        node_id = node.node_id
        for name, version in node.ready_keys - keys:
            by_version = index[name]
            ids = by_version[version]
            ids.discard(node_id)
            if not ids:
                del by_version[version]
                if not by_version:
                    del index[name]
        for name, version in keys - node.ready_keys:
            index.setdefault(name, {}).setdefault(version, set()).add(node_id)
        node.ready_keys = keys

    def _next_deadline(self, node: _Node) -> float:
        base = max(node.seen_at, self._grace_from)
        factor = self.suspect_after if node.state is NodeLiveness.ALIVE else self.dead_after
        return base + factor * node.interval_s

    def _arm(self, node: _Node, at: float) -> None:
        """Make sure the node's timer fires no later than ``at`` (earlier is fine: it re-arms)."""
        if self._closed:
            return
        if node.timer is not None:
            if node.timer_at <= at:
                return
            node.timer.cancel()
        node.timer = self._ev().call_at(at, self._on_timer, node)
        node.timer_at = at

    def _cancel(self, node: _Node) -> None:
        if node.timer is not None:
            node.timer.cancel()
            node.timer = None

    def _on_timer(self, node: _Node) -> None:
        node.timer = None
        if self._closed or node.state is NodeLiveness.DEAD or self._nodes.get(node.node_id) is not node:
            return
        if not self._link_up:
            self._frozen.add(node.node_id)
            return
        now = self._ev().time()
        deadline = self._next_deadline(node)
        if now + _EARLY_S < deadline:
            self._arm(node, deadline)
            return
        if node.state is NodeLiveness.ALIVE:
            self._transition(node, NodeLiveness.ALIVE, NodeLiveness.SUSPECT, REASON_TIMEOUT)
            deadline = self._next_deadline(node)
            if now + _EARLY_S < deadline:
                self._arm(node, deadline)
                return
        self._transition(node, node.state, NodeLiveness.DEAD, REASON_TIMEOUT)

    def _view(self, node: _Node, now: float) -> NodeView:
        hb = node.heartbeat
        at = node.last_heartbeat_at
        return NodeView(
            node_id=node.node_id,
            state=node.state,
            last_heartbeat_at=at,
            last_heartbeat_age_s=None if at is None else max(0.0, now - at),
            bdseq=node.bdseq,
            interval_s=node.interval_s,
            grpc_address=node.grpc_address,
            http_address=node.http_address,
            models=list(hb.models) if hb is not None else [],
            load=hb.load if hb is not None else None,
            reported_state=hb.state if hb is not None else None,
            state_since=node.since,
        )

    def _transition(
        self,
        node: _Node,
        old: NodeLiveness | None,
        new: NodeLiveness,
        reason: str,
        *,
        retained: bool = False,
    ) -> None:
        now = self._ev().time()
        node.state = new
        node.since = now
        self.counters.transitions += 1
        event_type = "node_rejoined" if old is NodeLiveness.DEAD and new is NodeLiveness.ALIVE else _EVENT_TYPES[new]
        detail: dict[str, object] = {"reason": reason, "previous": old.value if old else None, "bdseq": node.bdseq}
        if reason == REASON_TIMEOUT:
            detail["silent_s"] = round(now - max(node.seen_at, self._grace_from), 3)
            detail["interval_s"] = node.interval_s
        if retained:
            detail["retained"] = True
        event = Event(type=event_type, ts=int(time.time() * 1000), node_id=node.node_id, detail=detail)
        self._events.append(event)
        level = logging.INFO if new is NodeLiveness.ALIVE else logging.WARNING
        log.log(level, "%s %s: %s", event_type, node.node_id, reason)
        if self._publisher is not None:
            try:
                self._publisher(event)
            except Exception:
                log.exception("event publisher failed")
        self._emit(node, old, new, TransitionInfo(reason, self._view(node, now), event))

    def _notify_same(self, node: _Node, reason: str) -> None:
        if self._listeners:
            self._emit(node, node.state, node.state, TransitionInfo(reason, self._view(node, self._ev().time()), None))

    def _emit(self, node: _Node, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
        for callback in list(self._listeners):
            try:
                callback(node.node_id, old, new, info)
            except Exception:
                log.exception("membership listener failed for %s", node.node_id)
