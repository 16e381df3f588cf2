"""The gateway's HTTP surface.

``POST /v2/models/{m}/infer`` and ``POST /v2/models/{m}/versions/{v}/infer`` take an
OIP v2 inference request (JSON, or the binary tensor extension with
``Inference-Header-Content-Length``) and answer with whatever the chosen edge answered
(see ``central.gateway.proxy``). Optional request header ``X-Modelfleet-Affinity-Key``:
requests with the same key go to the same node while it is healthy (consistent
hashing). Answers carry ``X-Modelfleet-Node``. Bodies over ``max_body_bytes`` get 413;
beyond ``max_outstanding`` requests at once, 503 with ``Retry-After``.

``GET /api/v1/gateway``: routing policy, per-node outstanding requests and breaker
states, and counters."""

from __future__ import annotations

import ssl
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from central.gateway.candidates import ModelCatalog, NodeSource
from central.gateway.metadata import create_metadata_router
from central.gateway.proxy import AFFINITY_HEADER, GatewayProxy, GatewayResponse
from central.gateway.router import GatewayRouter
from central.gateway.timeouts import ReadTimeouts
from central.settings import GatewaySettings
from fleetwire.names import InvalidName, check_name


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


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def _response(answer: GatewayResponse) -> Response:
    return Response(content=answer.body, status_code=answer.status, headers=answer.headers)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


class GatewayError(BaseModel):
    """The gateway's own error answers: ``{"error": "…"}``."""

    error: str


#: The gateway's 503 (a node's answers pass through as they are; 413 is declared app-wide).
_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {
        "model": GatewayError,
        "description": "No node can serve the model, or the gateway holds max_outstanding requests",
        "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
    },
}


def create_gateway_router(proxy: GatewayProxy, catalog: ModelCatalog | None = None) -> APIRouter:
    """The gateway's routes over ``proxy``; ``catalog`` (central's registry) describes the
    models no node serves yet."""
    router = APIRouter()

    async def forward(name: str, version: str | None, request: Request) -> Response:
        try:  # a name no model can have gets the rule, not a 503 "no node serves it"
            check_name("model name", name)
            if version is not None:
                check_name("version", version)
        except InvalidName as exc:
            return _error(422, str(exc))
        with proxy.holding() as refusal:  # before a byte of the body is read
            if refusal is not None:
                return _response(refusal)
            body = await _read_body(request, proxy.max_body_bytes)
            if body is None:
                proxy.stats.too_large += 1
                return _error(413, f"request body exceeds the limit of {proxy.max_body_bytes} bytes")
            key = request.headers.get(AFFINITY_HEADER) or None
            return _response(await proxy.forward_recorded(name, version, body, request.headers, key))

    @router.post("/v2/models/{name}/infer", responses=_INFER_RESPONSES)
    async def gateway_infer(name: str, request: Request) -> Response:
        return await forward(name, None, request)

    @router.post("/v2/models/{name}/versions/{version}/infer", responses=_INFER_RESPONSES)
    async def gateway_infer_version(name: str, version: str, request: Request) -> Response:
        return await forward(name, version, request)

    router.include_router(create_metadata_router(proxy, catalog))

    @router.get("/api/v1/gateway")
    async def gateway_status() -> dict[str, Any]:
        return proxy.snapshot()

    return router
