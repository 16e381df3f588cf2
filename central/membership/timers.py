"""When tracked nodes move on: one lazily re-armed ``loop.call_at`` deadline per node.

Timers: one ``loop.call_at`` handle per node, re-armed lazily. A heartbeat only stores the
time it arrived (a few attribute writes); when a node's timer fires it recomputes the
deadline from the latest heartbeat and either re-arms for it or moves the node on. So a
node that beats every second costs one timer callback every ``suspect_after`` seconds, no
heap operation per heartbeat, and there is never a scan over all nodes.

Grace: deadlines are counted from the later of the node's last sign of life and the last
time central's broker link came up (``resume``; the tracker binding its loop counts as
one). Nodes learned from retained births when central (re)starts, or when its consumer
reconnects after a broker outage, therefore get a full window to send a fresh heartbeat
before they can be declared suspect or dead; while the link is down (``pause``) no timer
moves a node on at all (central cannot hear anyone, which says nothing about them).

Local health: a silence is judged against the moment up to which central has heard
everything (``heard_until``: now minus central's own inbound lag, measured by the
consumer with probes through the broker), not against the wall clock. When central
falls behind its feed (a start-up storm, a stalled loop), heartbeats that have been sent
are still queued in front of it; convicting their senders would turn one slow moment
into a wave of false deaths and ring churn that slows it further (HashiCorp's Lifeguard
makes the same point about a failure detector's own health).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from central.membership.liveness import NodeLiveness
from central.membership.node_state import TrackedNode

__all__ = ["EARLY_S", "NodeTimers", "OnDue"]

#: Timer callbacks may run up to the loop's clock resolution early; uvloop counts in ms.
EARLY_S = 0.001

#: ``on_due(node, old_state, new_state)``: a deadline passed, move the node on (a timeout).
OnDue = Callable[[TrackedNode, NodeLiveness, NodeLiveness], None]


class NodeTimers:
    """The deadline of every node in ``nodes`` (the tracker's own dict, read live).

    ``get_loop`` returns the loop to schedule on; ``on_due`` performs a timeout transition
    (and may re-enter this object: every decision after it reads the state afresh)."""

    def __init__(
        self,
        nodes: Mapping[str, TrackedNode],
        *,
        suspect_after: float,
        dead_after: float,
        get_loop: Callable[[], asyncio.AbstractEventLoop],
        on_due: OnDue,
    ) -> None:
        self.suspect_after = suspect_after
        self.dead_after = dead_after
        #: Loop time of the last link-up; no deadline is counted from earlier than this.
        self.grace_from = float("-inf")
        self.link_is_up = True
        self._nodes = nodes
        self._get_loop = get_loop
        self._on_due = on_due
        #: Ids of nodes whose timer fired while the link was down.
        self._frozen: set[str] = set()
        self._closed = False
        #: Seconds of feed central has not read yet (0 when it keeps up).
        self.lag: Callable[[], float] = _no_lag

    def window_start(self, node: TrackedNode) -> float:
        """Where the node's current silence is counted from."""
        return max(node.seen_at, self.grace_from)

    def deadline(self, node: TrackedNode) -> float:
        """When the node moves on (to suspect if alive, else to dead) unless heard from."""
        factor = self.suspect_after if node.state is NodeLiveness.ALIVE else self.dead_after
        return self.window_start(node) + factor * node.interval_s

    def schedule(self, node: TrackedNode) -> None:
        """Make sure the node's timer fires no later than its current deadline."""
        self._arm(node, self.deadline(node))

    def cancel(self, node: TrackedNode) -> None:
        """Drop the node's timer, if any."""
        if node.timer is not None:
            node.timer.cancel()
            node.timer = None

    def pause(self) -> None:
        """The link is down: freeze every timeout until ``resume``."""
        self.link_is_up = False

    def resume(self) -> None:
        """The link is up (again): every node gets a full window from now."""
        self.link_is_up = True
        self.grace_from = self._get_loop().time()
        frozen, self._frozen = self._frozen, set()
        for node_id in frozen:
            node = self._nodes.get(node_id)
            if node is not None and node.state is not NodeLiveness.DEAD:
                self.schedule(node)

    def close(self) -> None:
        """Cancel every timer; no node is moved on any more."""
        self._closed = True
        for node in self._nodes.values():
            if node.timer is not None:
                node.timer.cancel()
                node.timer = None

    def _arm(self, node: TrackedNode, at: float) -> None:
        """Make sure the node's timer fires no later than ``at`` (earlier is fine: it re-arms)."""
        if self._closed:
            return
        if node.timer is not None:
            if node.timer_at <= at:
                return
            node.timer.cancel()
        node.timer = self._get_loop().call_at(at, self._fire, node)
        node.timer_at = at

    def _fire(self, node: TrackedNode) -> None:
        node.timer = None
        if self._closed or node.state is NodeLiveness.DEAD or self._nodes.get(node.node_id) is not node:
            return
        if not self.link_is_up:
            self._frozen.add(node.node_id)
            return
        now = self._get_loop().time()
        lag = max(0.0, self.lag())
        if self._rearm_if_early(node, now, lag):
            return
        if node.state is NodeLiveness.ALIVE:
            self._on_due(node, NodeLiveness.ALIVE, NodeLiveness.SUSPECT)
            if self._rearm_if_early(node, now, lag):
                return
        self._on_due(node, node.state, NodeLiveness.DEAD)

    def _rearm_if_early(self, node: TrackedNode, now: float, lag: float) -> bool:
        """Re-arm and say True if the node's deadline is still ahead of what central has
        heard (``now - lag``). Behind its feed, central looks again after at most one of
        the node's intervals, so a backlog that drains fast does not delay a verdict."""
        deadline = self.deadline(node)
        if now + EARLY_S < deadline:
            self._arm(node, deadline)
            return True
        heard_until = now - lag
        if heard_until + EARLY_S < deadline:
            self._arm(node, now + min(deadline - heard_until, node.interval_s))
            return True
        return False


def _no_lag() -> float:
    return 0.0
