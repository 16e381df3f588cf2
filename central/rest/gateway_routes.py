"""The gateway's HTTP surface (``central.gateway`` does the routing).

``POST /v2/models/{m}/infer`` and ``POST /v2/models/{m}/versions/{v}/infer`` take an
OIP v2 inference request (JSON, or the binary tensor extension with
``Inference-Header-Content-Length``) and answer with whatever the chosen edge answered
(see ``central.gateway.proxy``). Optional request header ``X-Modelfleet-Affinity-Key``:
requests with the same key go to the same node while it is healthy (consistent
hashing). Answers carry ``X-Modelfleet-Node``. Bodies over ``max_body_bytes`` get 413;
beyond ``max_outstanding`` requests at once (counted from when a body has arrived), 503
with ``Retry-After``; a body not received within central's ``body_timeout_s``, 408.

KServe v2 / Triton health and metadata (``central.gateway.metadata``): ``/v2/health/*``,
``/v2``, ``/v2/models/{m}[/versions/{v}]`` with ``/config`` and ``/ready``.

``GET /api/v1/gateway``: routing policy, per-node outstanding requests and breaker
states, and counters (the text APIs' under ``text``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from central.gateway.candidates import ModelCatalog
from central.gateway.catalog import GatedCatalog
from central.gateway.metadata import gateway_server_metadata, json_answer, model_ready, node_document
from central.gateway.proxy import AFFINITY_HEADER, GatewayProxy, GatewayResponse
from central.gateway.text_proxy import TextGateway
from central.rest.auth import caller_token
from fleetwire.names import InvalidName, check_name


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def _response(answer: GatewayResponse) -> Response:
    return Response(content=answer.body, status_code=answer.status, headers=answer.headers)


async def read_limited_body(request: Request, limit: int) -> bytes | None:
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


def create_gateway_router(
    proxy: GatewayProxy, catalog: GatedCatalog | None = None, text: TextGateway | None = None
) -> APIRouter:
    """The gateway's routes over ``proxy``; ``catalog`` (central's registry) describes the
    models no node serves yet; ``text``'s counters join the status."""
    router = APIRouter()

    async def forward(name: str, version: str | None, request: Request) -> Response:
        try:  # a name no model can have gets the rule, not a 503 "no node serves it"
            check_name("model name", name)
            if version is not None:
                check_name("version", version)
        except InvalidName as exc:
            return _error(422, str(exc))
        if (refusal := proxy.refusal()) is not None:  # a full gateway reads no body
            return _response(refusal)
        # The body is read holding no place: a client sending it slowly holds only its
        # socket, until central's body_timeout_s (fleetwire.body_deadline) answers 408.
        body = await read_limited_body(request, proxy.max_body_bytes)
        if body is None:
            proxy.stats.too_large += 1
            return _error(413, f"request body exceeds the limit of {proxy.max_body_bytes} bytes")
        with proxy.holding() as refusal:
            if refusal is not None:
                return _response(refusal)
            key = request.headers.get(AFFINITY_HEADER) or None
            return _response(await proxy.forward_recorded(name, version, body, request.headers, key))

    @router.post("/v2/models/{name}/infer", responses=_INFER_RESPONSES)
    async def gateway_infer(name: str, request: Request) -> Response:
        return await forward(name, None, request)

    @router.post("/v2/models/{name}/versions/{version}/infer", responses=_INFER_RESPONSES)
    async def gateway_infer_version(name: str, version: str, request: Request) -> Response:
        return await forward(name, version, request)

    router.include_router(_metadata_router(proxy, catalog))

    @router.get("/api/v1/gateway")
    async def gateway_status() -> dict[str, Any]:
        status = proxy.snapshot()
        if text is not None:
            status["text"] = text.snapshot()
        return status

    return router


class GatewayErrorBody(BaseModel):
    """``{"error": "…"}``."""

    error: str


class LiveBody(BaseModel):
    """``{"live": true}``."""

    live: bool


class ReadyBody(BaseModel):
    """The server's or a model's readiness (a model's carries its name)."""

    name: str | None = None
    ready: bool


class ServerMetadataBody(BaseModel):
    """The OIP server metadata document."""

    name: str
    version: str
    extensions: list[str]


_ERRORS: dict[int | str, dict[str, Any]] = {422: {"model": GatewayErrorBody}}
_DOCUMENT: dict[int | str, dict[str, Any]] = {
    200: {"model": dict[str, Any], "description": "The document of a node that serves the model (or the registry's)"},
    404: {"model": GatewayErrorBody},
    503: {"model": GatewayErrorBody},
    **_ERRORS,
}
_MODEL_READY: dict[int | str, dict[str, Any]] = {200: {"model": ReadyBody}, 400: {"model": ReadyBody}, **_ERRORS}


def _metadata_router(proxy: GatewayProxy, catalog: GatedCatalog | None = None) -> APIRouter:
    """Health, server metadata, model readiness, metadata and configuration over ``proxy``;
    ``catalog`` describes models no node serves yet."""
    router = APIRouter()
    document = gateway_server_metadata()

    @router.get("/v2/health/live", responses={200: {"model": LiveBody}})
    async def live() -> Response:
        return _response(json_answer({"live": True}))

    @router.get("/v2/health/ready", responses={200: {"model": ReadyBody}})
    async def ready() -> Response:
        return _response(json_answer({"ready": True}))

    @router.get("/v2", responses={200: {"model": ServerMetadataBody}})
    async def server_metadata() -> Response:
        return _response(json_answer(document))

    async def readable(request: Request) -> ModelCatalog | None:
        return await catalog.for_caller(caller_token(request.scope)) if catalog is not None else None

    @router.get("/v2/models/{name}", responses=_DOCUMENT)
    async def metadata(name: str, request: Request) -> Response:
        return _response(await node_document(proxy, name, None, "", await readable(request)))

    @router.get("/v2/models/{name}/versions/{v}", responses=_DOCUMENT)
    async def version_metadata(name: str, v: str, request: Request) -> Response:
        return _response(await node_document(proxy, name, v, "", await readable(request)))

    @router.get("/v2/models/{name}/config", responses=_DOCUMENT)
    async def config(name: str) -> Response:
        return _response(await node_document(proxy, name, None, "/config"))

    @router.get("/v2/models/{name}/versions/{v}/config", responses=_DOCUMENT)
    async def version_config(name: str, v: str) -> Response:
        return _response(await node_document(proxy, name, v, "/config"))

    @router.get("/v2/models/{name}/ready", responses=_MODEL_READY)
    async def is_ready(name: str) -> Response:
        return _response(model_ready(proxy, name, None))

    @router.get("/v2/models/{name}/versions/{v}/ready", responses=_MODEL_READY)
    async def is_version_ready(name: str, v: str) -> Response:
        return _response(model_ready(proxy, name, v))

    return router
