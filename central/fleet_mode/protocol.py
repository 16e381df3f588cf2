"""What differs between a central alone and one replica of a replicated central: one
``FleetMode``, picked once at start (``central.fleet_mode.open_fleet_mode``), gives the
services what they would otherwise ask ``if replicated`` about."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from central.gateway.candidates import NodeSource
from central.membership.failover import FailoverCoordinator
from central.membership.nodes import NodeDirectory, NodeSink
from central.membership.tracker import MembershipTracker
from central.mqtt.consumer import MembershipConsumer
from central.placement import PlacementService
from central.registry.signing import ManifestSigner
from central.rollout import DirectoryFleet, RolloutBook, RolloutController
from central.storage.protocols import ShadowCounts


@dataclass(frozen=True)
class FleetParts:
    """This process's services a mode steers (a replica: ring mirror, leadership, partitions)."""

    directory: NodeDirectory
    liveness: MembershipTracker
    consumer: MembershipConsumer | None
    placement: PlacementService
    book: RolloutBook
    controller: RolloutController
    #: Re-read everything and re-place (coalesced by the caller).
    changed: Callable[[], None]
    #: Read the decisions another replica may have written (fallbacks, verdicts, caps): a store
    #: read, run in a worker thread; it returns what takes them, called on the loop.
    read_decisions: Callable[[], Callable[[], None]] = lambda: lambda: None


class SharedLiveness(Protocol):
    """One node's row of the liveness replicas share (the dashboard shows nodes others track)."""

    @property
    def node_id(self) -> str: ...

    @property
    def state(self) -> str:
        """``alive``, ``suspect`` or ``dead``."""
        ...

    @property
    def http_address(self) -> str: ...

    @property
    def models(self) -> tuple[Mapping[str, Any], ...]:
        """What the node last reported: ``name``, ``version``, ``state`` and ``error`` of each."""
        ...


class FleetMode(Protocol):
    """Where the fleet's state lives: this process alone, or shared by replicas in PostgreSQL."""

    #: Where registrations go besides this process's node directory.
    registrations: NodeSink

    def signer(self, data_dir: Path) -> ManifestSigner:
        """The manifest key: this data dir's, or the one every replica shares."""
        ...

    def node_source(self, liveness: MembershipTracker) -> NodeSource:
        """Where the gateway finds the nodes serving a model."""
        ...

    def rollout_fleet(self, directory: NodeDirectory, liveness: MembershipTracker) -> DirectoryFleet:
        """The nodes rollouts plan over, and where their reports and clocks come from."""
        ...

    def heartbeat_partitions(self, node_id: str) -> tuple[int, int]:
        """``(partitions, the node's partition)`` an edge's heartbeat topics use; ``(0, 0)``: none."""
        ...

    def changed_here(self) -> None:
        """A change made by this process (a push, a rollout step): tell whoever shares the state."""
        ...

    def leader_epoch(self) -> int | None:
        """The epoch this process's leader decisions are fenced by (None: alone, unfenced)."""
        ...

    def shadow_counts(self) -> ShadowCounts:
        """Where heartbeats' shadow counts go to be judged: this process, or the leader."""
        ...

    def leads(self) -> bool:
        """Whether this process runs rollouts and places chunks now."""
        ...

    def failover(self, liveness: MembershipTracker, directory: NodeDirectory) -> FailoverCoordinator | None:
        """What takes dead nodes off the ring (None: the shared liveness does, on a replica)."""
        ...

    def steer(self, parts: FleetParts) -> None:
        """Take the services to steer (once, after they exist, before ``start``)."""
        ...

    def start_rollouts(self) -> None:
        """At start: run the rollout controller now, or once this process leads."""
        ...

    def after_refresh(self) -> None:
        """Right after the desired state was recomputed (a replica stores or adopts the placement)."""
        ...

    def readiness(self) -> tuple[dict[str, bool], dict[str, Any]]:
        """``/readyz``: this mode's checks and what else it says."""
        ...

    def replicas(self) -> dict[str, Any]:
        """The live replicas, or this one process."""
        ...

    def shared_liveness(self) -> Mapping[str, SharedLiveness]:
        """Liveness rows of nodes other processes track (none when alone)."""
        ...

    def metrics(self) -> Iterable[Metric]:
        """This mode's own metric families."""
        ...

    async def start(self, *, http_url: str, grpc_address: str) -> None:
        """Join the fleet, once the listeners are up."""
        ...

    async def stop(self) -> None:
        """Leave the fleet (hand back what this process holds)."""
        ...

    def close(self) -> None:
        """Release what the mode opened (after ``stop``)."""
        ...
