"""Liveness of edge nodes from their MQTT births, deaths and heartbeats.

Pure logic on one asyncio loop: the MQTT consumer parses messages on paho's thread and
hands them over with ``call_soon_threadsafe``; nothing here touches the network, so it is
unit-testable with a real loop and small intervals.

States: ``alive`` → ``suspect`` (nothing heard for ``suspect_after`` × the node's declared
``interval_s``) → ``dead`` (``dead_after`` ×, or an ``offline`` status whose ``bdseq`` is
the one of the node's current session). An ``offline`` with any other ``bdseq`` is the
Last Will of a session that has already been superseded, or not the node's own, and is
ignored; a dead node's own heartbeats bring it back (see ``sessions``).

The pieces: value types in ``liveness``, the per-node record in ``node_state``, the
ready-model index in ``ready_index``, the bdseq session rules in ``sessions``, transition
events in ``notifier`` (into the fleet's event log, ``central.events``), and the per-node
deadlines (lazily re-armed timers, grace after a broker link-up, frozen while the link is
down) in ``timers``. The public names this module had
before the split are still importable from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from central.events import EventLog
from central.membership.liveness import (
    REASON_ADDRESSES,
    REASON_BIRTH,
    REASON_CLEAN,  # noqa: F401 - unused here, re-exported like every REASON_* name
    REASON_HEARTBEAT,
    REASON_TIMEOUT,
    REASON_WILL,  # noqa: F401
    Listener,
    NodeLiveness,
    NodeView,
    TrackerCounters,
    TransitionInfo,
)
from central.membership.node_state import NO_KEYS, TrackedNode
from central.membership.notifier import Notifier
from central.membership.ready_index import ReadyIndex, ready_ids, ready_keys, reindex
from central.membership.sessions import (
    Birth,
    classify_birth,
    death_ends_session,
    death_reason,
    heartbeat_is_stale,
    opens_later_session,
    revives_after_death,
    too_far_ahead,
)
from central.membership.timers import NodeTimers
from fleetwire.mqtt.fast import AnyHeartbeat
from fleetwire.mqtt.payloads import Event, NodeStatus

log = logging.getLogger(__name__)

__all__ = [
    "Listener",
    "MembershipTracker",
    "NodeLiveness",
    "NodeView",
    "TrackerCounters",
    "TransitionInfo",
]


def _check_settings(suspect_after: float, dead_after: float, default_interval_s: float, events_kept: int) -> None:
    if not 0 < suspect_after <= dead_after:
        raise ValueError("need 0 < suspect_after <= dead_after")
    if default_interval_s <= 0:
        raise ValueError("default_interval_s must be > 0")
    if events_kept < 1:
        raise ValueError("events_kept must be >= 1")


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
        events: EventLog | None = None,
    ) -> None:
        """``default_interval_s`` is assumed for a node until its first heartbeat
        declares its own ``interval_s`` (a birth carries none).

        Runs on ``loop``, else the loop running at construction, else the one running at
        the first call (so it can be built outside a loop, e.g. in ``Central.__init__``).
        ``events`` is the log to keep events in (e.g. one with a journal on disk); without
        it the tracker keeps the last ``events_kept`` in memory."""
        _check_settings(suspect_after, dead_after, default_interval_s, events_kept)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.default_interval_s = float(default_interval_s)
        self.counters = TrackerCounters()
        self._nodes: dict[str, TrackedNode] = {}
        if events is None:
            events = EventLog(events_kept)
        if publisher is not None:
            events.publisher = publisher
        self._notifier = Notifier(events)
        self._ready_index: ReadyIndex = {}
        self._heartbeat_watchers: list[Callable[[str, AnyHeartbeat], None]] = []
        self._timers = NodeTimers(
            self._nodes,
            suspect_after=float(suspect_after),
            dead_after=float(dead_after),
            get_loop=self._ev,
            on_due=self._time_out,
        )
        if loop is None:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
        if loop is not None:
            self._bind(loop)

    # ----------------------------------------------------------------- wiring

    def _bind(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        self._loop = loop
        self._timers.grace_from = loop.time()  # binding counts as the first link-up
        return loop

    def _ev(self) -> asyncio.AbstractEventLoop:
        """The loop: given, running at construction, or the one of the first call."""
        loop = self._loop
        return loop if loop is not None else self._bind(asyncio.get_running_loop())

    @property
    def suspect_after(self) -> float:
        """Silence, in heartbeat intervals, after which an alive node becomes suspect."""
        return self._timers.suspect_after

    @suspect_after.setter
    def suspect_after(self, value: float) -> None:
        self._timers.suspect_after = value

    @property
    def dead_after(self) -> float:
        """Silence, in heartbeat intervals, after which a suspect node becomes dead."""
        return self._timers.dead_after

    @dead_after.setter
    def dead_after(self, value: float) -> None:
        self._timers.dead_after = value

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback`` on every transition (on the loop); returns an unsubscribe."""
        return self._notifier.subscribe(callback)

    def watch_heartbeats(self, callback: Callable[[str, AnyHeartbeat], None]) -> Callable[[], None]:
        """Call ``callback(node_id, heartbeat)`` with every heartbeat taken as a node's latest
        (on the loop, so keep it cheap); returns an unsubscribe."""
        self._heartbeat_watchers.append(callback)
        return lambda: self._heartbeat_watchers.remove(callback)

    def set_publisher(self, publisher: Callable[[Event], None] | None) -> None:
        """Hand every event to ``publisher`` as well (e.g. the MQTT events topic)."""
        self._notifier.events.publisher = publisher

    @property
    def link_is_up(self) -> bool:
        """Whether central currently hears the broker."""
        return self._timers.link_is_up

    def _heard_at(self) -> float:
        """When a message being read now was sent, on the loop's clock: now minus central's
        inbound lag. Silences are counted from it, so a backlog is not mistaken for one."""
        return self._ev().time() - max(0.0, self._timers.lag())

    def set_lag_source(self, lag: Callable[[], float]) -> None:
        """Where central's inbound lag comes from (seconds of feed not yet read): no node
        is moved on for a silence that may only be central being behind."""
        self._timers.lag = lag

    def link_down(self) -> None:
        """Central lost its broker connection: freeze every timeout until ``link_up``."""
        self._timers.pause()

    def link_up(self) -> None:
        """Central (re)connected: every node gets a full window from now."""
        self._timers.resume()

    def close(self) -> None:
        """Cancel every timer; the tracker stops moving nodes on."""
        self._timers.close()

    # ----------------------------------------------------------------- input

    def on_heartbeat(self, node_id: str, hb: AnyHeartbeat) -> None:
        """A heartbeat from ``node_id`` (already checked to match ``hb.node_id``)."""
        self.counters.heartbeats_processed += 1
        now = self._heard_at()
        node = self._nodes.get(node_id)
        if node is None:
            node = self._add(node_id, hb.bdseq, hb.interval_s, now)
            self._store_heartbeat(node, hb, now)
            self._first_seen(node, REASON_HEARTBEAT)
            return
        state = node.state
        if state is NodeLiveness.DEAD:
            if not self._revives(node, hb):
                self.counters.stale_heartbeats_ignored += 1
                return
        elif hb.bdseq != node.bdseq and not self._moves_session(node, hb):
            return
        node.bdseq = hb.bdseq
        shorter = hb.interval_s < node.interval_s
        addresses = hb.grpc_address != node.grpc_address or hb.http_address != node.http_address
        self._store_heartbeat(node, hb, now)
        if state is not NodeLiveness.ALIVE:
            node.dead_bdseq = None
            node.revive_from = None
            self._transition(node, state, NodeLiveness.ALIVE, REASON_HEARTBEAT)
            self._timers.schedule(node)
            return
        if shorter or node.timer is None:
            self._timers.schedule(node)
        if addresses:
            self._notify_same(node, REASON_ADDRESSES)

    def _moves_session(self, node: TrackedNode, hb: AnyHeartbeat) -> bool:
        """Whether a heartbeat of another session moves a live node on to it; when not
        (stale, or too far ahead), it is counted."""
        if heartbeat_is_stale(node, hb):
            self.counters.stale_heartbeats_ignored += 1
            return False
        if too_far_ahead(node, hb.bdseq):
            self.counters.bdseq_ahead_ignored += 1
            return False
        return True

    def _revives(self, node: TrackedNode, hb: AnyHeartbeat) -> bool:
        """Whether ``hb`` brings the dead ``node`` back; if not, it is remembered so that
        the next heartbeat of its session, in order, does."""
        if opens_later_session(node, hb) or revives_after_death(node, hb):
            return True
        node.revive_from = (hb.bdseq, hb.seq)
        return False

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
            node = self._add(node_id, status.bdseq, self.default_interval_s, now)
            node.birth_ts = status.ts
            self._first_seen(node, REASON_BIRTH, retained=retained)
            return
        kind = classify_birth(node, status)
        if kind is Birth.REPEAT:
            node.birth_ts = max(node.birth_ts, status.ts)  # not a fresh sign of life
            return
        if kind is Birth.STALE:
            self.counters.stale_births_ignored += 1
            return
        if kind is Birth.AHEAD:
            self.counters.bdseq_ahead_ignored += 1
            return
        if kind is Birth.RESET:
            self.counters.bdseq_resets += 1
        self._rebirth(node, status, now, retained)

    def _rebirth(self, node: TrackedNode, status: NodeStatus, now: float, retained: bool) -> None:
        """A new session of a known node: a fresh sign of life."""
        node.bdseq = status.bdseq
        node.birth_ts = status.ts
        node.dead_bdseq = None
        node.revive_from = None
        node.seen_at = now
        old = node.state
        if old is not NodeLiveness.ALIVE:
            self._transition(node, old, NodeLiveness.ALIVE, REASON_BIRTH, retained=retained)
        self._timers.schedule(node)

    def _on_death(self, node_id: str, status: NodeStatus, retained: bool) -> None:
        node = self._nodes.get(node_id)
        if node is None:
            # Never seen alive (typically a retained death at start-up): remember it, quietly.
            node = self._add(node_id, status.bdseq, self.default_interval_s, self._ev().time())
            node.state = NodeLiveness.DEAD
            node.dead_bdseq = status.bdseq
            return
        if not death_ends_session(node, status):
            self.counters.stale_deaths_ignored += 1
            return
        node.dead_bdseq = status.bdseq
        node.revive_from = None
        if node.state is NodeLiveness.DEAD:
            return
        reason = death_reason(node, status)
        self._timers.cancel(node)
        self._transition(node, node.state, NodeLiveness.DEAD, reason, retained=retained)

    # ----------------------------------------------------------------- queries

    def get(self, node_id: str) -> NodeView | None:
        """One node, or None."""
        node = self._nodes.get(node_id)
        return None if node is None else node.view(self._ev().time())

    def nodes(self) -> list[NodeView]:
        """Every known node (dead ones too), by id."""
        now = self._ev().time()
        return [self._nodes[k].view(now) for k in sorted(self._nodes)]

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
        ids = ready_ids(self._ready_index, self._nodes, model, version)
        return [self._nodes[node_id].view(now) for node_id in sorted(ids)]

    def ready_endpoints(self, model: str, version: str | None = None) -> list[tuple[str, str]]:
        """(node id, http address) of ``ready_nodes``, unsorted and without building views:
        cheap enough for a gateway to call on every request."""
        nodes = self._nodes
        ids = ready_ids(self._ready_index, nodes, model, version)
        return [(node_id, nodes[node_id].http_address) for node_id in ids]

    def events(self, limit: int | None = None) -> list[Event]:
        """The last ``limit`` events (all kept when None), oldest first."""
        return self._notifier.events.last(limit)

    def events_since(self, seq: int, limit: int) -> list[Event]:
        """Up to ``limit`` kept events numbered above ``seq``, oldest first."""
        return self._notifier.events.since(seq, limit)

    def forget(self, node_id: str) -> bool:
        """Drop a dead node's record (a decommissioned node); False if unknown or not dead."""
        node = self._nodes.get(node_id)
        if node is None or node.state is not NodeLiveness.DEAD:
            return False
        self._timers.cancel(node)
        reindex(self._ready_index, node, NO_KEYS)
        del self._nodes[node_id]
        return True

    def release(self, node_ids: Iterable[str]) -> int:
        """Stop tracking these nodes without any transition: a replicated central handed their
        heartbeat partition to another replica, which tracks them from now (nobody is declared
        dead for it). Returns how many were tracked."""
        released = 0
        for node_id in node_ids:
            node = self._nodes.get(node_id)
            if node is None:
                continue
            self._timers.cancel(node)
            reindex(self._ready_index, node, NO_KEYS)
            del self._nodes[node_id]
            released += 1
        return released

    def node_ids(self) -> list[str]:
        """Every tracked node's id (any state)."""
        return list(self._nodes)

    # Called by the consumer on paho's thread; plain int increments with a single writer.
    def count_malformed(self) -> None:
        """One message dropped because it did not parse or did not match its topic."""
        self.counters.malformed_dropped += 1

    def count_oversized(self) -> None:
        """One message dropped unread because it exceeded ``MAX_PAYLOAD_BYTES``."""
        self.counters.oversized_dropped += 1

    # ----------------------------------------------------------------- internals

    def _add(self, node_id: str, bdseq: int, interval_s: float, now: float) -> TrackedNode:
        node = self._nodes[node_id] = TrackedNode(node_id, bdseq, interval_s, now)
        return node

    def _first_seen(self, node: TrackedNode, reason: str, *, retained: bool = False) -> None:
        self._transition(node, None, NodeLiveness.ALIVE, reason, retained=retained)
        self._timers.schedule(node)

    def _store_heartbeat(self, node: TrackedNode, hb: AnyHeartbeat, now: float) -> None:
        node.record_heartbeat(hb, now)
        keys = ready_keys(hb)
        if keys != node.ready_keys:
            reindex(self._ready_index, node, keys)
        for watcher in self._heartbeat_watchers:
            watcher(node.node_id, hb)

    def _time_out(self, node: TrackedNode, old: NodeLiveness, new: NodeLiveness) -> None:
        self._transition(node, old, new, REASON_TIMEOUT)

    def _transition(
        self,
        node: TrackedNode,
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
        silent_s = now - self._timers.window_start(node)
        self._notifier.transition(node, old, reason, now=now, silent_s=silent_s, retained=retained)

    def _notify_same(self, node: TrackedNode, reason: str) -> None:
        if self._notifier.has_listeners:
            info = TransitionInfo(reason, node.view(self._ev().time()), None)
            self._notifier.emit(node.node_id, node.state, node.state, info)
