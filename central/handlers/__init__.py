"""Central's use cases, one method each, over its services (MLServer's ``handlers/``): the
REST routes, the gRPC servicers and the gateway call these and only translate."""

from __future__ import annotations

from dataclasses import dataclass

from central.dashboard import DashboardService
from central.gateway import GatewayProxy
from central.gateway.catalog import GatedCatalog
from central.gateway.text_proxy import TextGateway
from central.handlers.edges import EdgeHandlers, Registration
from central.handlers.fleet import FleetHandlers
from central.handlers.health import HealthHandlers
from central.handlers.registry import PushOptions, PushRequest, RegistryHandlers
from central.handlers.rollouts import RolloutHandlers
from central.observability import CentralMetrics
from central.storage.offload import StoreCalls
from central.storage.protocols import Tokens

__all__ = [
    "ApiHandlers",
    "EdgeHandlers",
    "FleetHandlers",
    "HealthHandlers",
    "PushOptions",
    "PushRequest",
    "Registration",
    "RegistryHandlers",
    "RolloutHandlers",
]


@dataclass(frozen=True)
class ApiHandlers:
    """What central's HTTP API serves: operators' use cases, the dashboard, the metrics and the
    gateway. (Edges' use cases, ``EdgeHandlers``, go to the gRPC Registry service alone.)"""

    registry: RegistryHandlers
    fleet: FleetHandlers
    rollouts: RolloutHandlers
    health: HealthHandlers
    #: The inference gateway (REST, and KServe v2 gRPC with ``registry.describe`` as catalog).
    gateway: GatewayProxy
    metrics: CentralMetrics
    dashboard: DashboardService
    #: The REST API's operator tokens (``auth.enabled``), else None.
    operator_tokens: Tokens | None
    #: Where the API's own store calls (the operator tokens') run: off the event loop.
    store_calls: StoreCalls
    #: The gateway's description of models no node serves (readers only with ``protect_reads``).
    catalog: GatedCatalog
    #: The gateway's text APIs (OpenAI-compatible, OIP generate) over ``gateway``.
    text: TextGateway
