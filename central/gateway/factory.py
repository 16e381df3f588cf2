"""Builds the gateway (router, read timeouts, proxy) from its settings."""

from __future__ import annotations

import ssl

from central.gateway.candidates import ModelCatalog, NodeSource
from central.gateway.proxy import GatewayProxy
from central.gateway.router import GatewayRouter
from central.gateway.timeouts import ReadTimeouts
from central.settings import GatewaySettings


def create_gateway(
    source: NodeSource,
    settings: GatewaySettings | None = None,
    *,
    scheme: str = "http",
    ssl_context: ssl.SSLContext | None = None,
    catalog: ModelCatalog | None = None,
) -> GatewayProxy:
    """A router and proxy over ``source`` configured by ``settings``, reaching edges over
    ``scheme`` (verified with ``ssl_context`` for https); ``catalog`` tells an unknown model
    (404) from one no node serves yet (503); ``close()`` it at shutdown."""
    s = settings or GatewaySettings()
    router = GatewayRouter(source, policy=s.policy, failure_threshold=s.failure_threshold, open_s=s.open_s)
    timeouts = ReadTimeouts(
        factor=s.read_timeout_factor,
        floor_s=s.read_timeout_floor_s,
        cap_s=max(s.read_timeout_cap_s, s.read_timeout_floor_s),
        fixed=s.model_timeouts,
    )
    return GatewayProxy(
        router,
        attempts=s.attempts,
        deadline_s=s.deadline_s,
        connect_timeout_s=s.connect_timeout_s,
        read_timeout_s=s.read_timeout_s,
        timeouts=timeouts,
        max_body_bytes=s.max_body_bytes,
        max_connections=s.max_connections,
        max_outstanding=s.max_outstanding,
        scheme=scheme,
        ssl_context=ssl_context,
        catalog=catalog,
    )
