"""A central alone: this process holds the fleet's state and decides everything."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from central.fleet_mode.protocol import FleetParts, SharedLiveness
from central.gateway.candidates import Candidate, NodeSource
from central.membership.failover import FailoverCoordinator
from central.membership.nodes import LocalRegistrations, NodeDirectory, NodeSink
from central.membership.tracker import MembershipTracker
from central.registry.signing import ManifestSigner
from central.rollout import DirectoryFleet, RolloutController
from central.storage.memory import LocalShadowCounts
from central.storage.protocols import ShadowCounts


class TrackerNodeSource:
    """Gateway candidates: alive nodes whose last heartbeat lists the model ready."""

    def __init__(self, tracker: MembershipTracker) -> None:
        self._tracker = tracker

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """Node id and HTTP address of every node that can serve ``model`` (``version``)."""
        return [Candidate(n, a) for n, a in self._tracker.ready_endpoints(model, version) if a]


class LocalMode:
    """The ``FleetMode`` of a single central."""

    def __init__(self) -> None:
        self.registrations: NodeSink = LocalRegistrations()
        self._controller: RolloutController | None = None
        self._counts = LocalShadowCounts()

    def signer(self, data_dir: Path) -> ManifestSigner:
        """This data dir's key (created on first start)."""
        return ManifestSigner.load_or_create(data_dir)

    def node_source(self, liveness: MembershipTracker) -> NodeSource:
        """This process's heartbeats."""
        return TrackerNodeSource(liveness)

    def rollout_fleet(self, directory: NodeDirectory, liveness: MembershipTracker) -> DirectoryFleet:
        """The directory, with reports and clocks from this process's heartbeats."""
        return DirectoryFleet(directory, liveness)

    def heartbeat_partitions(self, node_id: str) -> tuple[int, int]:
        """No partitions: edges keep the unpartitioned topics."""
        return 0, 0

    def changed_here(self) -> None:
        """Nobody else to tell."""

    def leader_epoch(self) -> int | None:
        """No epoch: nobody else decides."""
        return None

    def shadow_counts(self) -> ShadowCounts:
        """In memory: this process hears every heartbeat and judges them."""
        return self._counts

    def leads(self) -> bool:
        """Always."""
        return True

    def failover(self, liveness: MembershipTracker, directory: NodeDirectory) -> FailoverCoordinator | None:
        """Dead nodes leave the ring, and come back, as this process's heartbeats say."""
        return FailoverCoordinator(liveness, directory)

    def steer(self, parts: FleetParts) -> None:
        """Remember the rollout controller (``start_rollouts``)."""
        self._controller = parts.controller

    def start_rollouts(self) -> None:
        """Now (the controller tells the log of each rollout it resumes)."""
        if self._controller is not None:
            self._controller.start()

    def after_refresh(self) -> None:
        """The placement lives here only."""

    def readiness(self) -> tuple[dict[str, bool], dict[str, Any]]:
        """No checks of its own."""
        return {}, {}

    def replicas(self) -> dict[str, Any]:
        """This one process."""
        return {"replicated": False, "replicas": [{"replica_id": None, "leader": True}]}

    def shared_liveness(self) -> Mapping[str, SharedLiveness]:
        """Nobody else tracks nodes."""
        return {}

    def metrics(self) -> Iterable[Metric]:
        """None."""
        return ()

    async def start(self, *, http_url: str, grpc_address: str) -> None:
        """Nothing to join."""

    async def stop(self) -> None:
        """Nothing to leave."""

    def close(self) -> None:
        """Nothing opened."""
