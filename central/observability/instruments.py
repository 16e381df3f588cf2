"""The instrumented part of central's metrics: what happens (requests, transitions),
as opposed to what is (the collector's job)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from central.gateway import GatewayProxy
from central.membership.liveness import NodeLiveness, TransitionInfo
from central.membership.tracker import MembershipTracker
from central.observability.collector import CentralStateCollector

__all__ = ["MAX_MODEL_LABELS", "OTHER_MODEL", "CentralMetrics", "gateway_outcome"]

#: Distinct ``model`` label values the gateway metrics keep; model names come from
#: request paths, so without a bound any client could grow the series without end.
MAX_MODEL_LABELS = 256
#: The ``model`` label of requests beyond ``MAX_MODEL_LABELS``.
OTHER_MODEL = "_other"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def gateway_outcome(status: int) -> str:
    """The ``outcome`` label of a gateway answer with HTTP ``status``."""
    if status < 400:
        return "ok"
    if status == 404:
        return "not_found"
    if status == 413:
        return "too_large"
    if status == 503:
        return "unavailable"
    return "client_error" if status < 500 else "error"


class CentralMetrics:
    """Every metric of one central, in its own registry.

    Registers the state collector, gives the gateway a request observer and listens
    to the tracker's membership transitions."""

    def __init__(self, state: CentralStateCollector, gateway: GatewayProxy, membership: MembershipTracker) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(state)
        self._state = state
        self._requests = Counter(
            "modelfleet_gateway_requests",
            "Inference requests answered by the gateway, by model and outcome"
            " (ok, not_found, too_large, client_error, unavailable, error).",
            ("model", "outcome"),
            registry=self.registry,
        )
        self._latency = Histogram(
            "modelfleet_gateway_request_duration_seconds",
            "Time from a gateway request's arrival to its answer, retries included.",
            ("model",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._events = Counter(
            "modelfleet_membership_events",
            "Membership transitions by event type (node_alive, node_suspect, node_dead, node_rejoined).",
            ("type",),
            registry=self.registry,
        )
        self._models: set[str] = set()
        self._children: dict[tuple[str, str], Any] = {}
        gateway.observer = self.gateway_request
        membership.subscribe(self._on_transition)

    async def refresh(self) -> None:
        """Read what comes from the stores (off the loop); a scrape awaits this, then collects."""
        await self._state.refresh()

    def gateway_request(self, model: str, status: int, seconds: float) -> None:
        """Record one answered gateway request (called on every request: cached children)."""
        key = (self._model_label(model), gateway_outcome(status))
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self._requests.labels(model=key[0], outcome=key[1]),
                self._latency.labels(model=key[0]),
            )
        children[0].inc()
        children[1].observe(seconds)

    def _model_label(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= MAX_MODEL_LABELS:
            return OTHER_MODEL
        self._models.add(model)
        return model

    def _on_transition(self, node_id: str, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
        if info.event is not None:
            self._events.labels(type=info.event.type).inc()
