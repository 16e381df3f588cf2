"""What operators read about the fleet and set for it: nodes, membership, events, verdicts,
origin figures and edges' transfer caps. One method per use case, plain data out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from central.distribution import DesiredStateService, VerdictBook
from central.distribution.runtime_fit import RUNTIME_REASON
from central.distribution.transfer_policy import TransferPolicy
from central.events import operator_event
from central.membership.liveness import NodeView
from central.membership.nodes import NodeDirectory
from central.membership.tracker import MembershipTracker
from central.mqtt.consumer import MembershipConsumer
from central.origin import OriginService
from central.placement import PlacementService
from central.settings import TransferSettings
from fleetwire.mqtt.payloads import Event


def _membership_entry(v: NodeView) -> dict[str, Any]:
    return {
        "node_id": v.node_id,
        "state": str(v.state),
        "last_heartbeat_age_s": v.last_heartbeat_age_s,
        "bdseq": v.bdseq,
        "interval_s": v.interval_s,
        "grpc_address": v.grpc_address,
        "http_address": v.http_address,
        "hardware_class": v.hardware_class,
        "models": [m.model_dump() for m in v.models],
        "load": v.load.model_dump() if v.load is not None else None,
        "cache": v.cache.model_dump() if v.cache is not None else None,
    }


def _served_artifacts(view: NodeView | None) -> list[dict[str, Any]]:
    """The artifact each version is served as on a node, why, and its speed-up over FP32
    (from its last heartbeat; empty before one)."""
    if view is None:
        return []
    return [
        {"model": m.name, "version": m.version, **m.choice.model_dump()} for m in view.models if m.choice is not None
    ]


def _refused(refusals: dict[tuple[str, str], str]) -> list[dict[str, Any]]:
    """Versions central does not assign a node because its ONNX Runtime cannot load them, in
    the shape of a heartbeat's failed models (``reason`` ``runtime``)."""
    return [
        {"name": name, "version": version, "state": "failed", "reason": RUNTIME_REASON, "error": why}
        for (name, version), why in sorted(refusals.items())
    ]


class FleetHandlers:
    """Nodes, membership, events, verdicts, origin figures and transfer caps."""

    def __init__(
        self,
        *,
        directory: NodeDirectory,
        liveness: MembershipTracker,
        consumer: MembershipConsumer | None,
        placement: PlacementService,
        verdicts: VerdictBook,
        desired: DesiredStateService,
        origin: OriginService,
        transfer: TransferPolicy,
        record_event: Callable[[Event], None],
    ) -> None:
        self._directory = directory
        self._liveness = liveness
        self._consumer = consumer
        self._placement = placement
        self._verdicts = verdicts
        self._desired = desired
        self._origin = origin
        self._transfer = transfer
        self._record_event = record_event

    def nodes(self) -> list[dict[str, Any]]:
        """Registered nodes: what they announced (their ONNX Runtime's limits: ``runtime``, null
        from an edge that does not say), the versions central refuses them because that runtime
        cannot load them (``refused``), the artifacts they serve, chunks they own."""
        return [
            {
                "node_id": n.node_id,
                "grpc_address": n.grpc_address,
                "http_address": n.http_address,
                "capacity": n.capacity,
                "labels": n.labels,
                "hardware_class": n.hardware_class,
                "site": n.site,
                "runtime": n.runtime.as_json() if n.runtime is not None else None,
                "refused": _refused(self._desired.runtime_refusals(n.node_id)),
                "artifacts": _served_artifacts(self._liveness.get(n.node_id)),
                "owned_chunks": len(self._placement.owned_by(n.node_id)),
            }
            for n in self._directory.nodes()
        ]

    def membership(self, summary: bool = False) -> dict[str, Any]:
        """Counts and counters of the liveness tracker and (unless ``summary``) every node's view."""
        tracker = self._liveness
        body: dict[str, Any] = {"counts": tracker.counts(), "counters": tracker.counters.as_dict()}
        if self._consumer is not None:
            body["inbound_lag_s"] = round(self._consumer.probe.lag(), 4)
        if not summary:
            body["nodes"] = [_membership_entry(v) for v in tracker.nodes()]
        return body

    def events(self, limit: int = 100, since: int | None = None) -> list[dict[str, Any]]:
        """Without ``since``: the last ``limit`` events. With it: the first ``limit`` kept events
        numbered above it (a page; the next one starts after the last seq returned)."""
        limit = max(1, min(limit, 10_000))
        found = self._liveness.events(limit) if since is None else self._liveness.events_since(since, limit)
        return [e.model_dump() for e in found]

    def verdicts(self) -> list[dict[str, Any]]:
        """Which artifact each hardware class serves, as the first node of the class timed it."""
        return self._verdicts.all()

    def stats(self) -> dict[str, Any]:
        """The desired state's generation and what central sent as the origin."""
        o = self._origin.stats
        return {
            "generation": self._desired.generation,
            "origin": {
                "bytes_sent": o.bytes_sent,
                "chunks_sent": o.chunks_sent,
                "refused": o.refused,
                "denied": o.denied,
                "bytes_by_node": dict(o.bytes_by_node),
            },
        }

    def transfer(self) -> dict[str, Any]:
        """Edges' chunk byte-rate caps: fleet, per site, per node."""
        return self._transfer.settings.model_dump()

    async def replace_transfer(self, caps: TransferSettings, actor: str) -> dict[str, Any]:
        """Replace the whole policy; every connected edge gets its new caps in a desired state."""
        await self._transfer.replace(caps)
        self._record_event(operator_event("transfer_caps_changed", actor, caps.model_dump(exclude_none=True)))
        return caps.model_dump()
