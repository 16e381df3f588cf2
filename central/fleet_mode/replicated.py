"""One replica of a replicated central: the fleet's state lives in PostgreSQL, shared by every
replica (``central.ha``); this module needs psycopg (the [postgres] extra), so it is imported
only when ``ha.replica_id`` is set."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from central.fleet_mode.protocol import FleetParts, SharedLiveness
from central.gateway.candidates import NodeSource
from central.ha.fleet_store import FleetStore
from central.ha.metrics import replica_metrics
from central.ha.replica import Replica
from central.ha.shared_files import share_signing_key
from central.ha.view import SharedNodeSource, SharedView, record_to_json
from central.membership.failover import FailoverCoordinator
from central.membership.nodes import NodeDirectory, NodeRecord, NodeSink
from central.membership.tracker import MembershipTracker
from central.registry.signing import ManifestSigner
from central.rollout import DirectoryFleet
from central.settings import CentralSettings
from central.storage.postgres.shadow_counts import PostgresShadowCounts
from central.storage.protocols import ShadowCounts
from fleetwire.mqtt.topics import partition_of

log = logging.getLogger(__name__)


class SharedRegistrations:
    """Registrations this replica takes go to the shared store first (a failed write registers
    nobody); a closing watch stream evicts nobody (the edge only moved to another replica)."""

    closing_stream_leaves = False

    def __init__(self, fleet: FleetStore) -> None:
        self._fleet = fleet

    def put(self, record: NodeRecord) -> None:
        """A registration this replica took."""
        self._fleet.put_node(record.node_id, record_to_json(record))

    def remove(self, node_id: str) -> None:
        """An explicit unregister this replica took."""
        self._fleet.remove_node(node_id)


class ReplicatedMode:
    """The ``FleetMode`` of one replica: shared state first, then the ``Replica`` that steers."""

    def __init__(self, settings: CentralSettings) -> None:
        store = settings.store
        assert store.url is not None  # the settings require it with ha.replica_id
        self._settings = settings
        self._fleet = FleetStore(store.url, connect_timeout_s=store.connect_timeout_s)
        self._counts = PostgresShadowCounts(store.url, connect_timeout_s=store.connect_timeout_s)
        self._view = SharedView()
        self.registrations: NodeSink = SharedRegistrations(self._fleet)
        self._replica: Replica  # set by ``steer``, before anything asks
        self._bump_errors = 0

    def signer(self, data_dir: Path) -> ManifestSigner:
        """The key every replica shares (the first replica's, stored in PostgreSQL)."""
        with self._fleet.connection() as conn:
            return share_signing_key(conn, data_dir)

    def node_source(self, liveness: MembershipTracker) -> NodeSource:
        """The shared liveness, whichever replica tracks the node."""
        return SharedNodeSource(self._view)

    def rollout_fleet(self, directory: NodeDirectory, liveness: MembershipTracker) -> DirectoryFleet:
        """The directory, with reports and clocks from the shared liveness."""
        return DirectoryFleet(directory, reports=self._view.reported, clocks=self._view.clock)

    def heartbeat_partitions(self, node_id: str) -> tuple[int, int]:
        """Every replica computes the same answer: an edge registering elsewhere keeps its topics."""
        n = self._settings.ha.partitions
        return n, partition_of(node_id, n)

    def changed_here(self) -> None:
        """Bump the fleet generation: the other replicas re-read."""
        try:
            self._fleet.bump()
        except Exception as exc:  # they catch up at their next poll of the generation
            self._bump_errors += 1
            log.warning("could not bump the fleet generation: %s", exc)

    def leader_epoch(self) -> int | None:
        """The epoch this replica was granted the leadership at (None: it does not lead)."""
        return self._replica.leader_epoch

    def shadow_counts(self) -> ShadowCounts:
        """PostgreSQL: written by the replica that hears a node, judged by the leader."""
        return self._counts

    def leads(self) -> bool:
        """Whether this replica leads right now, with its epoch known. The control thread sets
        ``is_leader`` before the loop learns the epoch (``leadership_gained``): in that gap a
        leader's pass would write unfenced (``fence`` None), so it counts as not leading yet."""
        return self._replica.is_leader and self._replica.leader_epoch is not None

    def failover(self, liveness: MembershipTracker, directory: NodeDirectory) -> FailoverCoordinator | None:
        """None: the ring follows the shared liveness (``Replica``)."""
        return None

    def steer(self, parts: FleetParts) -> None:
        """Build the ``Replica`` over these services."""
        self._replica = Replica(self._settings, self._fleet, self._view, parts)

    def start_rollouts(self) -> None:
        """Not now: the controller runs only while this replica leads (``Replica``)."""

    def after_refresh(self) -> None:
        """The leader stores its placement; a follower adopts the leader's."""
        self._replica.after_refresh()

    def health(self) -> dict[str, Any]:
        """Leadership, partitions, links and write counters."""
        health = self._replica.health()
        health["write_errors"] += self._bump_errors
        return health

    def readiness(self) -> tuple[dict[str, bool], dict[str, Any]]:
        """The control session and the fleet feed must be up."""
        health = self.health()
        checks = {"control_session": health["control_connected"], "fleet_feed": health["generation_connected"]}
        return checks, {"replica": health}

    def replicas(self) -> dict[str, Any]:
        """The live replicas and who leads."""
        control = self._replica.control
        return {
            "replicated": True,
            "this": self._replica.replica_id,
            "leader_id": control.leader_id() if control is not None else None,
            "replicas": [dataclasses.asdict(r) for r in self._replica.replicas()],
        }

    def shared_liveness(self) -> Mapping[str, SharedLiveness]:
        """The shared liveness rows, as last read."""
        return self._view.liveness

    def metrics(self) -> Iterable[Metric]:
        """This replica's families."""
        return replica_metrics(self.health())

    async def start(self, *, http_url: str, grpc_address: str) -> None:
        """Join the replicas: others route to this one once it says it is up."""
        await self._replica.start(http_url=http_url, grpc_address=grpc_address)

    async def stop(self) -> None:
        """Hand back leadership and partitions at once."""
        await self._replica.stop()

    def close(self) -> None:
        """Release the shared store."""
        self._replica.close()
        self._fleet.close()
        self._counts.close()
