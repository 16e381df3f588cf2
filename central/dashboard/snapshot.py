"""One JSON document with everything the dashboard draws, built from the services
named in ``DashboardSources``.

Read-only and synchronous: every source is an in-memory structure on the loop (the
tracker, the node directory, the placement), except the model list, which is one small
SQLite read. Ages are computed here, in seconds, so the page needs no clock agreement
with central: it adds the time elapsed since the document arrived."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from central.dashboard.language_models import language_models_section
from central.distribution import DesiredStateService
from central.fleet_mode.protocol import SharedLiveness
from central.gateway import GatewayProxy
from central.membership import NodeDirectory
from central.membership.liveness import NodeView
from central.membership.tracker import MembershipTracker
from central.origin import OriginService
from central.placement import PlacementService
from central.registry.service import RegistryService
from central.storage.protocols import ModelRecord, VersionRecord

__all__ = ["MAX_CHUNK_CELLS", "MAX_EVENTS", "DashboardSources", "build_snapshot", "membership_event"]

#: Events of the membership/rollout log sent with each snapshot (newest first).
MAX_EVENTS = 60
#: Chunks per version drawn in the chunk map; a version with more is drawn truncated.
MAX_CHUNK_CELLS = 512
#: Versions listed per model (newest first).
MAX_VERSIONS = 6

#: (model, version) -> chunk digest -> owners, in file order.
Placed = dict[tuple[str, str], dict[str, list[str]]]


@dataclass(frozen=True)
class DashboardSources:
    """The services a snapshot reads (all read-only here)."""

    liveness: MembershipTracker
    """Liveness, last heartbeats, counters and the event log."""
    directory: NodeDirectory
    """Nodes registered over gRPC (capacity, labels)."""
    registry: RegistryService
    """Models and their versions."""
    placement: PlacementService
    """Chunk owners of every placed version."""
    desired: DesiredStateService
    """The desired-state generation."""
    origin: OriginService
    """Bytes central sent as the origin."""
    gateway: GatewayProxy
    """The gateway's counters and rolling figures."""
    gateway_enabled: bool
    """Whether the gateway routes are served."""
    mqtt_enabled: bool
    """Whether central follows heartbeats over MQTT (else there is no broker link to show)."""
    shared: Callable[[], Mapping[str, SharedLiveness]]
    """Liveness of the nodes other replicas track (``FleetMode.shared_liveness``; none alone)."""
    replicas: Callable[[], dict[str, Any]]
    """The live replicas and who leads, or this one process (``FleetMode.replicas``)."""


def _node(
    view: NodeView | None, record: Any, now: float, owned: int, shared: SharedLiveness | None = None
) -> dict[str, Any]:
    """One node row: liveness from the tracker, registration from the directory; on a replica,
    a node another replica tracks gets its state and models from the shared liveness."""
    load = view.load.model_dump() if view is not None and view.load is not None else None
    cache = view.cache.model_dump() if view is not None and view.cache is not None else None
    if view is not None:
        models = [m.model_dump() for m in view.models]
    else:
        models = [dict(m) for m in shared.models] if shared is not None else []
    node_id = view.node_id if view is not None else record.node_id if record is not None else ""
    return {
        "node_id": node_id or (shared.node_id if shared is not None else ""),
        # A node registered over gRPC but never heard on MQTT has no liveness yet.
        "state": str(view.state) if view is not None else (shared.state if shared is not None else "unknown"),
        "tracked_here": view is not None,
        "state_age_s": round(now - view.state_since, 3) if view is not None else None,
        "last_heartbeat_age_s": _round(view.last_heartbeat_age_s) if view is not None else None,
        "interval_s": view.interval_s if view is not None else None,
        "reported_state": view.reported_state if view is not None else None,
        "http_address": (view.http_address if view is not None else "")
        or (shared.http_address if shared is not None else "")
        or (record.http_address if record else ""),
        "registered": record is not None,
        "capacity": record.capacity if record is not None else None,
        "labels": dict(record.labels) if record is not None else {},
        "hardware_class": (record.hardware_class if record is not None else "")
        or (view.hardware_class if view is not None else ""),
        "site": record.site if record is not None else None,
        "mode": view.mode if view is not None else None,
        "autonomous_since_ms": view.autonomous_since_ms if view is not None else None,
        "load": load,
        "cache": cache,
        "models": models,
        "owned_chunks": owned,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def nodes_section(sources: DashboardSources, now: float, placed: Placed) -> list[dict[str, Any]]:
    """Every node the tracker or the directory knows, by id."""
    views = {v.node_id: v for v in sources.liveness.nodes()}
    records = {r.node_id: r for r in sources.directory.nodes()}
    shared = sources.shared()
    owned: dict[str, set[str]] = {}
    for owners_by_digest in placed.values():  # one pass, not one scan of the placement per node
        for digest, owners in owners_by_digest.items():
            for node_id in owners:
                owned.setdefault(node_id, set()).add(digest)
    return [
        _node(views.get(node_id), records.get(node_id), now, len(owned.get(node_id, ())), shared.get(node_id))
        for node_id in sorted(views.keys() | records.keys() | shared.keys())
    ]


def _serving(model: str, nodes: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """version -> state -> node ids, from the heartbeats of the nodes not dead."""
    serving: dict[str, dict[str, list[str]]] = {}
    for node in nodes:
        if node["state"] == "dead":
            continue
        for m in node["models"]:
            if m["name"] == model:
                serving.setdefault(m["version"], {}).setdefault(m["state"], []).append(node["node_id"])
    return serving


def placed_versions(placement: PlacementService, versions: dict[str, list[VersionRecord]]) -> Placed:
    """Chunk owners (digest -> owners, file order) of every listed version the fleet holds:
    the stable version of each model and, during a rollout, the new one."""
    placed: Placed = {}
    for name, records in versions.items():
        for record in records:
            owners_by_digest = placement.placement((name, record.version))
            if owners_by_digest:
                placed[(name, record.version)] = owners_by_digest
    return placed


def models_section(
    models: list[ModelRecord], versions: dict[str, list[VersionRecord]], placed: Placed, nodes: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Models with their newest versions (which are placed on the fleet) and where each stands."""
    latest = {m.name: m for m in models}
    return [
        {
            "name": name,
            "latest": latest[name].latest if name in latest else None,
            "version_count": latest[name].versions if name in latest else len(records),
            "kind": records[-1].manifest.kind if records else None,
            "versions": [
                {
                    "version": r.version,
                    "size": r.manifest.size,
                    "chunks": len(r.manifest.chunks),
                    "artifact": r.manifest.artifact,
                    "created_at": r.created_at,
                    "placed": (name, r.version) in placed,
                }
                for r in records
            ],
            "serving": _serving(name, nodes),
        }
        for name, records in versions.items()
    ]


def placement_section(placed: Placed) -> list[dict[str, Any]]:
    """For each placed version: its chunks' owners in file order and a count per node."""
    return [_placed(name, version, owners_by_digest) for (name, version), owners_by_digest in placed.items()]


def _placed(name: str, version: str, owners_by_digest: dict[str, list[str]]) -> dict[str, Any]:
    per_node: dict[str, dict[str, int]] = {}
    for owners in owners_by_digest.values():
        for rank, node_id in enumerate(owners):
            counts = per_node.setdefault(node_id, {"primary": 0, "replica": 0})
            counts["primary" if rank == 0 else "replica"] += 1
    digests = list(owners_by_digest)
    return {
        "model": name,
        "version": version,
        "chunks": len(digests),
        "per_node": per_node,
        "owners": [owners_by_digest[d] for d in digests[:MAX_CHUNK_CELLS]],
    }


def gateway_section(proxy: GatewayProxy, enabled: bool) -> dict[str, Any]:
    """The gateway's counters, its rate/latency now and a minute of history."""
    return {
        "enabled": enabled,
        "totals": asdict(proxy.stats),
        "now": proxy.rolling.summary(),
        "series": proxy.rolling.series(),
    }


def central_section(sources: DashboardSources) -> dict[str, Any]:
    """Central's own state: desired-state generation, broker link, detection settings."""
    tracker = sources.liveness
    return {
        "generation": sources.desired.generation,
        "mqtt_enabled": sources.mqtt_enabled,
        "broker_link_up": tracker.link_is_up if sources.mqtt_enabled else None,
        "suspect_after": tracker.suspect_after,
        "dead_after": tracker.dead_after,
        "counts": tracker.counts(),
        "counters": tracker.counters.as_dict(),
        "origin_bytes_sent": sources.origin.stats.bytes_sent,
        "replicas": sources.replicas(),
    }


async def build_snapshot(
    sources: DashboardSources, loop_now: float, rollouts: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The whole document; ``loop_now`` is the tracker loop's ``time()`` (state ages). The
    registry is read first, in a store worker (the newest ``MAX_VERSIONS`` of each model)."""
    models, versions = await sources.registry.recent(MAX_VERSIONS)
    placed = placed_versions(sources.placement, versions)
    nodes = nodes_section(sources, loop_now, placed)
    return {
        "ts": time.time(),
        "central": central_section(sources),
        "nodes": nodes,
        "models": models_section(models, versions, placed, nodes),
        "language_models": language_models_section(versions, nodes),
        "placement": placement_section(placed),
        "rollouts": rollouts,
        "events": [e.model_dump() for e in reversed(sources.liveness.events(MAX_EVENTS))],
        "gateway": gateway_section(sources.gateway, sources.gateway_enabled),
    }


def membership_event(node_id: str, new_state: str, view: NodeView, event: dict[str, Any] | None) -> dict[str, Any]:
    """What the stream sends the moment a node changes state (before the next snapshot)."""
    return {
        "node_id": node_id,
        "state": new_state,
        "last_heartbeat_age_s": _round(view.last_heartbeat_age_s),
        "event": event,
    }
