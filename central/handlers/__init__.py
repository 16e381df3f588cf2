"""Central's use cases, one method each, over its services (MLServer's ``handlers/``): the
REST routes, the gRPC servicers and the gateway call these and only translate."""

from __future__ import annotations

from dataclasses import dataclass

from central.auth.tokens import Tokens
from central.dashboard import DashboardService
from central.gateway import GatewayProxy
from central.handlers.edges import EdgeHandlers, Registration
from central.handlers.fleet import FleetHandlers
from central.handlers.health import HealthHandlers
from central.handlers.registry import PushOptions, PushRequest, RegistryHandlers
from central.handlers.rollouts import RolloutHandlers
from central.observability import CentralMetrics

__all__ = [
    "EdgeHandlers",
    "FleetHandlers",
    "Handlers",
    "HealthHandlers",
    "PushOptions",
    "PushRequest",
    "Registration",
    "RegistryHandlers",
    "RolloutHandlers",
]


@dataclass(frozen=True)
class Handlers:
    """Every handler of one central; each transport takes the ones it needs."""

    registry: RegistryHandlers
    fleet: FleetHandlers
    rollouts: RolloutHandlers
    health: HealthHandlers
    #: The gRPC Registry service's (what edges ask).
    edges: EdgeHandlers
    #: The inference gateway (REST and KServe v2 gRPC).
    gateway: GatewayProxy
    metrics: CentralMetrics
    dashboard: DashboardService
    #: The REST API's operator tokens (``auth.enabled``), else None.
    operator_tokens: Tokens | None
