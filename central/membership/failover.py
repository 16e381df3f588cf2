"""Glue from MQTT liveness to ring membership.

A node the tracker declares ``dead`` leaves the node directory, so the ring drops it and
its chunks get new owners; the existing fetch rules make those owners pull from a
surviving owner, or from central when none is left. A node this coordinator evicted that
comes back alive is put back exactly as it registered (addresses, capacity, labels, hardware
class, site): what a node is comes only from its token-checked gRPC ``Register``, never from
an MQTT birth or heartbeat, which any holder of its broker login can publish. A node alive on
MQTT that never registered here waits for its own ``Register`` (the edge re-registers over gRPC
by itself whenever it reconnects; either path is idempotent)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from central.membership.nodes import NodeDirectory, NodeRecord
from central.membership.tracker import MembershipTracker, NodeLiveness, TransitionInfo

log = logging.getLogger(__name__)

__all__ = ["FailoverCoordinator"]


class FailoverCoordinator:
    """Evicts dead nodes from the directory and restores nodes that come back."""

    def __init__(self, tracker: MembershipTracker, nodes: NodeDirectory) -> None:
        self._nodes = nodes
        #: What evicted nodes had registered with, to restore capacity and labels.
        self._evicted: dict[str, NodeRecord] = {}
        self.evictions = 0
        self.restorations = 0
        self._unsubscribe: Callable[[], None] | None = tracker.subscribe(self._on_transition)

    def close(self) -> None:
        """Stop reacting to the tracker."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_transition(self, node_id: str, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
        if new is NodeLiveness.DEAD:
            record = self._nodes.get(node_id)
            if record is not None and self._nodes.unregister(node_id):
                self._evicted[node_id] = record
                self.evictions += 1
                log.warning("node %s evicted from the ring (%s)", node_id, info.reason)
        elif new is NodeLiveness.ALIVE:
            if self._nodes.get(node_id) is not None:
                return
            previous = self._evicted.pop(node_id, None)
            if previous is None:
                return
            # As registered; the watch streams open at the eviction may still be: keep counting
            # them, or their close would evict the node again.
            self._nodes.register(dataclasses.replace(previous))
            self.restorations += 1
            log.info("node %s back on the ring (%s)", node_id, info.reason)
