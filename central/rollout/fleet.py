"""What the rollout controller needs to know about the fleet: registered nodes with
their labels (the node directory) and what each last reported (MQTT heartbeats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from central.distribution.runtime_fit import RUNTIME_REASON
from central.membership import NodeDirectory
from central.membership.tracker import MembershipTracker
from fleetwire.mqtt.payloads import ModelInfo

#: node id → the models it last reported (None before any report).
Reports = Callable[[str], "list[ModelInfo] | None"]
#: node id → ``(offset_ms, error_ms)`` of its clock (None: unknown).
Clocks = Callable[[str], "tuple[float, float] | None"]


class FleetView(Protocol):
    """Nodes and their reports, as the controller sees them."""

    def labels(self) -> dict[str, dict[str, str]]:
        """node id → labels of every node in the fleet now."""

    def labels_of(self, node_id: str) -> dict[str, str]:
        """The labels of one node ({} when unknown)."""

    def reported(self, node_id: str) -> list[ModelInfo] | None:
        """The model versions ``node_id`` last reported; None before its first heartbeat."""

    def clock(self, node_id: str) -> tuple[float, float] | None:
        """``(offset_ms, error_ms)`` of central's clock against the node's, as its last heartbeat
        said; None when unknown."""


class DirectoryFleet:
    """``FleetView`` over the node directory and what nodes reported: this central's membership
    tracker, or (a replica) the shared liveness its partitions' owners wrote."""

    def __init__(
        self,
        nodes: NodeDirectory,
        tracker: MembershipTracker | None = None,
        *,
        reports: Reports | None = None,
        clocks: Clocks | None = None,
    ) -> None:
        """``reports(node_id)`` and ``clocks(node_id)``: where reports and clock offsets come from
        instead of ``tracker`` (a replica: the shared liveness)."""
        self._clocks = clocks
        self._nodes = nodes
        #: node id → version → why central does not assign it there (its runtime cannot load it):
        #: reported as that version failed with reason ``runtime`` (set once the desired-state
        #: service exists; by default nothing is refused).
        self.refusals: Callable[[str], dict[tuple[str, str], str]] = lambda node_id: {}
        self._tracker = tracker
        self._reports = reports

    def labels(self) -> dict[str, dict[str, str]]:
        """Registered nodes (the ring members) and the labels they announced."""
        return {n.node_id: n.labels for n in self._nodes.nodes()}

    def labels_of(self, node_id: str) -> dict[str, str]:
        """The labels ``node_id`` registered with."""
        record = self._nodes.get(node_id)
        return record.labels if record is not None else {}

    def reported(self, node_id: str) -> list[ModelInfo] | None:
        """The models in ``node_id``'s last heartbeat, and the versions central refused it
        (``refusals``) as failed with reason ``runtime``: the node never gets them, so only
        central can say why they never became ready there."""
        reported = self._heard(node_id)
        refused = self.refusals(node_id)
        if not refused:
            return reported
        kept = [m for m in reported or () if (m.name, m.version) not in refused]
        return kept + [
            ModelInfo(name=name, version=version, state="failed", reason=RUNTIME_REASON, error=why)
            for (name, version), why in sorted(refused.items())
        ]

    def _heard(self, node_id: str) -> list[ModelInfo] | None:
        if self._reports is not None:
            return self._reports(node_id)
        assert self._tracker is not None, "a tracker or reports"
        view = self._tracker.get(node_id)
        return None if view is None or view.last_heartbeat_at is None else view.models

    def clock(self, node_id: str) -> tuple[float, float] | None:
        """What ``node_id``'s last heartbeat said of its clock."""
        if self._clocks is not None:
            return self._clocks(node_id)
        view = self._tracker.get(node_id) if self._tracker is not None else None
        if view is None or view.clock_offset_ms is None or view.clock_error_ms is None:
            return None
        return view.clock_offset_ms, view.clock_error_ms
