"""Metrics read from central's live state at scrape time: nothing here is updated on
the hot paths, so a scrape costs what it reads and serving costs nothing.

Runs on the event loop (the ``/metrics`` route calls it there), like every other
reader of the tracker, the placement and the gateway."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from central.distribution import DesiredStateService
from central.gateway import GatewayProxy
from central.membership import NodeDirectory
from central.membership.failover import FailoverCoordinator
from central.membership.tracker import MembershipTracker
from central.origin import OriginService
from central.placement import PlacementService
from central.registry.service import RegistryService, RegistryUsage
from central.rollout import RolloutService
from central.rollout.model import NodeProgress, RolloutState

__all__ = ["CentralStateCollector"]

_GATEWAY_COUNTERS = (
    ("attempts", "modelfleet_gateway_attempts", "Requests the gateway sent to nodes (a request may take several)."),
    (
        "retries",
        "modelfleet_gateway_retries",
        "Attempts after the first of a request: a node failed, the next was tried.",
    ),
    ("node_failures", "modelfleet_gateway_node_failures", "Attempts that failed: unreachable, timed out or 5xx."),
    (
        "timeouts",
        "modelfleet_gateway_timeouts",
        "Requests answered 504: the node did not answer within the request's read timeout.",
    ),
)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class CentralStateCollector(Collector):
    """Membership, nodes, placement, registry, origin, gateway and rollout figures."""

    def __init__(
        self,
        *,
        liveness: MembershipTracker,
        directory: NodeDirectory,
        failover: FailoverCoordinator | None,
        placement: PlacementService,
        desired: DesiredStateService,
        registry: RegistryService,
        origin: OriginService,
        gateway: GatewayProxy,
        rollouts: RolloutService,
        mode_metrics: Callable[[], Iterable[Metric]],
    ) -> None:
        """``mode_metrics``: the fleet mode's own families (a replica's leadership, partitions, writes)."""
        self._mode_metrics = mode_metrics
        self._liveness = liveness
        self._directory = directory
        self._failover = failover
        self._placement = placement
        self._desired = desired
        self._registry_service = registry
        #: The registry's figures as last read (``refresh``): the store is read off the loop,
        #: before a scrape, never inside ``collect`` (which runs on it).
        self._usage: RegistryUsage | None = None
        self._origin = origin
        self._gateway = gateway
        self._rollouts = rollouts

    async def refresh(self) -> None:
        """Read the registry's figures (in a store worker): a scrape awaits this first."""
        self._usage = await self._registry_service.usage()

    def collect(self) -> Iterable[Metric]:
        """Every family, read now."""
        yield from _membership(self._liveness)
        yield from self._nodes()
        yield from self._registry()
        o = self._origin.stats
        yield _counter("modelfleet_origin_sent_bytes", "Chunk bytes central sent as the origin.", o.bytes_sent)
        yield _counter("modelfleet_origin_chunks_sent", "Chunks central sent as the origin.", o.chunks_sent)
        yield _counter(
            "modelfleet_origin_refused", "Origin fetches refused because an owner had to be tried first.", o.refused
        )
        yield from _gateway(self._gateway)
        yield from _rollouts(self._rollouts)
        yield from self._mode_metrics()

    def _nodes(self) -> Iterator[Metric]:
        members = [n.node_id for n in self._directory.nodes()]
        yield _gauge("modelfleet_nodes", "Nodes registered with central (on the placement ring).", len(members))
        chunks = GaugeMetricFamily(
            "modelfleet_placement_chunks", "Chunks of the active versions each node owns.", labels=("node",)
        )
        owned = self._owned()
        for node_id in members:
            chunks.add_metric((node_id,), len(owned.get(node_id, ())))
        yield chunks
        failover = self._failover
        if failover is not None:
            yield _counter(
                "modelfleet_failovers",
                "Dead nodes taken off the placement ring (their chunks got new owners).",
                failover.evictions,
            )
            yield _counter(
                "modelfleet_node_restorations", "Nodes put back on the ring after coming back.", failover.restorations
            )
        yield _gauge(
            "modelfleet_desired_state_generation", "Desired-state generation (bumped by every change).",
            self._desired.generation,
        )  # fmt: skip

    def _owned(self) -> dict[str, set[str]]:
        """Node id → digests it owns, in one pass over the placements (``owned_by`` per
        node would cost nodes × chunks on a large fleet)."""
        owned: dict[str, set[str]] = {}
        # The last refresh's versions: re-planning here would read the store on the loop.
        for manifest in self._desired.manifests:
            for digest, owners in self._placement.placement(manifest.key).items():
                for owner in owners:
                    owned.setdefault(owner, set()).add(digest)
        return owned

    def _registry(self) -> Iterator[Metric]:
        u = self._usage
        if u is None:  # never read yet (a collect without a scrape's refresh)
            return
        yield _gauge("modelfleet_registry_models", "Models in the registry.", u.models)
        yield _gauge("modelfleet_registry_versions", "Model versions in the registry.", u.versions)
        yield _gauge("modelfleet_registry_blobs", "Chunk blobs stored by central.", u.blobs)
        yield _gauge("modelfleet_registry_blob_bytes", "Bytes of chunk blobs stored by central.", u.blob_bytes)


def _membership(tracker: MembershipTracker) -> Iterator[Metric]:
    states = GaugeMetricFamily(
        "modelfleet_membership_nodes", "Nodes known over MQTT, by liveness state.", labels=("state",)
    )
    for state, n in sorted(tracker.counts().items()):
        states.add_metric((state,), n)
    yield states
    k = tracker.counters
    yield _counter("modelfleet_heartbeats_processed", "Heartbeats central's tracker processed.", k.heartbeats_processed)
    yield _counter(
        "modelfleet_membership_statuses_processed", "Birth and death messages processed.", k.statuses_processed
    )
    dropped = CounterMetricFamily(
        "modelfleet_membership_messages_dropped",
        "MQTT messages dropped unprocessed: malformed (did not parse or match its topic) or oversized.",
        labels=("reason",),
    )
    dropped.add_metric(("malformed",), k.malformed_dropped)
    dropped.add_metric(("oversized",), k.oversized_dropped)
    yield dropped
    stale = CounterMetricFamily(
        "modelfleet_membership_stale_ignored",
        "Messages of a superseded session (older bdseq) ignored, by kind.",
        labels=("kind",),
    )
    stale.add_metric(("heartbeat",), k.stale_heartbeats_ignored)
    stale.add_metric(("birth",), k.stale_births_ignored)
    stale.add_metric(("death",), k.stale_deaths_ignored)
    yield stale
    yield _counter(
        "modelfleet_membership_bdseq_ahead_ignored",
        "Births and heartbeats ignored because their bdseq was too far ahead of a live node's session "
        "(a forged or confused sender must not replace a healthy session).",
        k.bdseq_ahead_ignored,
    )
    yield _gauge("modelfleet_membership_events_kept", "Events held for the API and dashboard.", len(tracker.events()))


def _gateway(proxy: GatewayProxy) -> Iterator[Metric]:
    stats = proxy.stats
    for attr, name, doc in _GATEWAY_COUNTERS:
        yield _counter(name, doc, getattr(stats, attr))
    in_flight = GaugeMetricFamily(
        "modelfleet_gateway_in_flight", "Gateway requests in flight to each node.", labels=("node",)
    )
    breakers = GaugeMetricFamily(
        "modelfleet_gateway_breakers", "Per-node circuit breakers by state.", labels=("state",)
    )
    by_state: dict[str, int] = {"closed": 0, "open": 0, "half_open": 0}
    for node in proxy.router.snapshot()["nodes"]:
        in_flight.add_metric((node["node_id"],), node["outstanding"])
        state = str(node["breaker"]["state"])
        by_state[state] = by_state.get(state, 0) + 1
    for state, n in sorted(by_state.items()):
        breakers.add_metric((state,), n)
    yield in_flight
    yield breakers


def _rollouts(service: RolloutService) -> Iterator[Metric]:
    rollouts = GaugeMetricFamily("modelfleet_rollouts", "Rollouts by state.", labels=("state",))
    nodes = GaugeMetricFamily(
        "modelfleet_rollout_nodes",
        "Nodes of each model's latest rollout by their state on its version (pending, loading, ready, failed).",
        labels=("model", "version", "state"),
    )
    by_state = dict.fromkeys(get_args(RolloutState), 0)
    seen: set[str] = set()
    for r in service.all():  # newest first
        by_state[r.state] += 1
        if r.model in seen:
            continue
        seen.add(r.model)
        progress = dict.fromkeys(get_args(NodeProgress), 0)
        for node_state in r.nodes.values():
            progress[node_state] += 1
        for node_state, n in progress.items():
            nodes.add_metric((r.model, r.version, node_state), n)
    for state, n in by_state.items():
        rollouts.add_metric((state,), n)
    yield rollouts
    yield nodes
