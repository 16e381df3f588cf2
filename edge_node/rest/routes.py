"""OIP v2 over HTTP: the ``/v2`` routes, a thin transport over the edge's :class:`DataPlane`.
Each route translates HTTP to one call on the plane and back; bodies are written with orjson,
never through pydantic models, since this is the hot path. Inference itself is
:func:`edge_node.rest.infer.infer_reply`, which the fast path runs too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from edge_node.errors import EdgeError
from edge_node.inference.dataplane import DataPlane
from edge_node.rest.body import read_body
from edge_node.rest.codec import HEADER_LENGTH
from edge_node.rest.infer import InferReply, infer_reply
from edge_node.rest.schema import INFER, INFER_BODY, LOOKUP, METADATA, NOT_READY, ServerMetadata

__all__ = ["create_oip_routes", "error_response", "json_response"]


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON response."""
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def error_response(exc: EdgeError) -> Response:
    """The OIP error shape with the error's status (and ``Retry-After`` on an overload)."""
    return json_response({"error": str(exc)}, exc.status, exc.retry_after_header)


def reply_response(reply: InferReply) -> Response:
    """``reply`` as a Starlette response."""
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)


def create_oip_routes(plane: DataPlane) -> APIRouter:
    """The ``/v2`` routes: each translates HTTP to one call on ``plane`` and back."""
    router = APIRouter()

    async def tracked(name: str, model_version: str | None, request: Request) -> Response:
        reply = await infer_reply(
            plane, name, model_version, lambda limit: read_body(request, limit), request.headers.get(HEADER_LENGTH)
        )
        return reply_response(reply)

    def answer(call: Callable[[], dict[str, Any]]) -> Response:
        try:
            return json_response(call())
        except EdgeError as exc:
            return error_response(exc)

    @router.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": plane.live()})

    @router.get("/v2/health/ready", responses=NOT_READY)
    async def ready() -> Response:
        is_ready = plane.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 400)

    @router.get("/v2", responses={200: {"model": ServerMetadata}})
    async def server_metadata() -> Response:
        return json_response(plane.server_metadata())

    async def model_ready(name: str, model_version: str | None) -> Response:
        try:
            is_ready = plane.model_ready(name, model_version)
        except EdgeError as exc:
            return error_response(exc)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 400)

    @router.get("/v2/models/{name}/config", responses=LOOKUP)
    async def model_config(name: str) -> Response:
        return answer(lambda: plane.model_config(name, None))

    @router.get("/v2/models/{name}/versions/{v}/config", responses=LOOKUP)
    async def version_config(name: str, v: str) -> Response:
        return answer(lambda: plane.model_config(name, v))

    @router.get("/v2/models/{name}", responses=METADATA)
    async def model_metadata(name: str) -> Response:
        return answer(lambda: plane.model_metadata(name, None))

    @router.get("/v2/models/{name}/versions/{v}", responses=METADATA)
    async def version_metadata(name: str, v: str) -> Response:
        return answer(lambda: plane.model_metadata(name, v))

    @router.get("/v2/models/{name}/ready", responses={**LOOKUP, **NOT_READY})
    async def is_model_ready(name: str) -> Response:
        return await model_ready(name, None)

    @router.get("/v2/models/{name}/versions/{v}/ready", responses={**LOOKUP, **NOT_READY})
    async def is_version_ready(name: str, v: str) -> Response:
        return await model_ready(name, v)

    @router.post("/v2/models/{name}/infer", responses=INFER, openapi_extra=INFER_BODY)
    async def infer(name: str, request: Request) -> Response:
        return await tracked(name, None, request)

    @router.post("/v2/models/{name}/versions/{v}/infer", responses=INFER, openapi_extra=INFER_BODY)
    async def infer_version(name: str, v: str, request: Request) -> Response:
        return await tracked(name, v, request)

    return router
