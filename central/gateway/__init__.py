"""Central's inference gateway: one OIP v2 endpoint in front of the fleet, routing each
request to an edge that serves the model (least outstanding requests, or consistent-hash
affinity), with per-node circuit breakers and retries on other nodes."""

from __future__ import annotations

from central.gateway.breaker import BreakerState, CircuitBreaker
from central.gateway.candidates import Candidate, ModelCatalog, NodeSource, StaticNodeSource
from central.gateway.factory import create_gateway
from central.gateway.proxy import AFFINITY_HEADER, NODE_HEADER, GatewayProxy, GatewayResponse, GatewayStats
from central.gateway.router import GatewayRouter, Policy

__all__ = [
    "AFFINITY_HEADER",
    "NODE_HEADER",
    "BreakerState",
    "Candidate",
    "CircuitBreaker",
    "GatewayProxy",
    "GatewayResponse",
    "GatewayRouter",
    "GatewayStats",
    "ModelCatalog",
    "NodeSource",
    "Policy",
    "StaticNodeSource",
    "create_gateway",
]
