"""OIP v2 over HTTP: a thin transport over the edge's :class:`DataPlane`. Each route
translates HTTP to one call on the plane and back; bodies are parsed and written with
orjson, never through pydantic models, since this is the hot path."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from edge_node.heartbeat.load import LoadTracker
from edge_node.inference.repository import LoadedModel, ModelRepository
from edge_node.oip.body import read_body
from edge_node.oip.codec import HEADER_LENGTH, InferRequest, OipError, decode_request, encode_response
from edge_node.oip.dataplane import DataPlane, OipLimits, PlaneError

log = logging.getLogger(__name__)

#: Reads the request body under a cap (its argument, in bytes); see ``edge_node.oip.body``.
BodyReader = Callable[[int], Awaitable[bytes]]


class ErrorBody(BaseModel):
    """The OIP error shape: ``{"error": "…"}``."""

    error: str


class ReadyBody(BaseModel):
    """A readiness answer that is "no": ``{"ready": false}`` (with the model's name for a model)."""

    name: str | None = None
    ready: bool


class TensorMetadata(BaseModel):
    """One input or output in OIP metadata."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """The OIP model metadata document (written with orjson; declared for the OpenAPI document)."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    """The OIP server metadata document."""

    name: str
    version: str
    extensions: list[str]


#: Error answers declared in the OpenAPI document, so clients (and the fuzz suite) know them.
#: 422: a model name or version that breaks the fleet's name rule (no model has one).
_LOOKUP: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}
_METADATA: dict[int | str, dict[str, Any]] = {200: {"model": ModelMetadata}, **_LOOKUP}
_NOT_READY: dict[int | str, dict[str, Any]] = {400: {"model": ReadyBody}}
#: 500: the node failed to run a request it accepted (out of memory, a failed device).
_INFER: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    413: {"model": ErrorBody},
    **_LOOKUP,
    500: {"model": ErrorBody},
}
#: The OIP v2 JSON request (binary tensor data is also accepted; the body is read raw).
_INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "inputs": {"type": "array", "items": {"type": "object"}},
                        "outputs": {"type": "array", "items": {"type": "object"}},
                        "parameters": {"type": "object"},
                    },
                }
            }
        }
    }
}


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON response."""
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """The OIP error shape."""
    return json_response({"error": message}, status, headers)


def _header_length(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.strip().isdigit()):  # "²".isdigit() is True, int("²") raises
        raise OipError(f"Inference-Header-Content-Length must be a non-negative integer, got {raw!r}")
    return int(raw)


def plane_error_response(exc: PlaneError) -> Response:
    """The OIP error shape with the plane's status (and ``Retry-After`` on an overload)."""
    return error_response(str(exc), exc.status, exc.retry_after_header)


@dataclass(frozen=True, slots=True)
class InferReply:
    """One inference answer, whatever writes it: status, body, content type and the extra
    headers (``Inference-Header-Content-Length``, ``Retry-After``)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] | None = None


def _error_reply(message: str, status: int, headers: dict[str, str] | None = None) -> InferReply:
    return InferReply(status, orjson.dumps({"error": message}), headers=headers)


async def _run_infer(
    plane: DataPlane, name: str, version: str | None, read: BodyReader, header_length: str | None
) -> InferReply:
    with plane.admitted(name, version):
        # The body before the lookup: no version swap between lookup and run.
        body = await read(plane.limits.max_body_bytes)
        length_in = _header_length(header_length)
        decoded: list[InferRequest] = []

        def decode(_: LoadedModel) -> InferRequest:
            decoded.append(decode_request(body, length_in, plane.limits.max_tensor_elements))
            return decoded[0]

        result = await plane.infer(name, version, decode)
    payload, length = encode_response(result.model.name, result.model.version, decoded[0], result.outputs)
    if length is None:
        return InferReply(200, payload)
    return InferReply(200, payload, "application/octet-stream", {"Inference-Header-Content-Length": str(length)})


async def infer_reply(
    plane: DataPlane, name: str, version: str | None, read: BodyReader, header_length: str | None
) -> InferReply:
    """The whole REST inference transport, shared by the FastAPI routes and the raw ASGI
    fast path (``edge_node.http.fastpath``) so the two cannot drift: admit, read the body
    with ``read(limit)``, decode it (``header_length``: the raw Inference-Header-Content-Length
    header), run it on ``plane`` and encode the answer; every failure becomes the OIP error
    shape with its status. A client that left (Starlette's ClientDisconnect) is re-raised:
    nobody is there to answer."""
    try:
        return await _run_infer(plane, name, version, read, header_length)
    except PlaneError as exc:
        return _error_reply(str(exc), exc.status, exc.retry_after_header)
    except OipError as exc:  # the body or its header, before the plane saw them
        return _error_reply(str(exc), exc.status)
    except ClientDisconnect:
        raise
    except Exception as exc:  # a bug here must still answer in the OIP error shape
        log.exception("inference request for %s failed", name)
        return _error_reply(f"the edge failed on this request: {type(exc).__name__}: {exc}", 500)


def reply_response(reply: InferReply) -> Response:
    """``reply`` as a Starlette response."""
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)


def create_oip_router(
    repository: ModelRepository, version: str, load: LoadTracker | None = None, limits: OipLimits | None = None
) -> APIRouter:
    """The ``/v2`` routes over a new :class:`DataPlane` on ``repository``."""
    return create_oip_routes(DataPlane(repository, version, load=load, limits=limits))


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
        except PlaneError as exc:
            return plane_error_response(exc)

    @router.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": plane.live()})

    @router.get("/v2/health/ready", responses=_NOT_READY)
    async def ready() -> Response:
        is_ready = plane.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 400)

    @router.get("/v2", responses={200: {"model": ServerMetadata}})
    async def server_metadata() -> Response:
        return json_response(plane.server_metadata())

    async def model_ready(name: str, model_version: str | None) -> Response:
        try:
            is_ready = plane.model_ready(name, model_version)
        except PlaneError as exc:
            return plane_error_response(exc)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 400)

    @router.get("/v2/models/{name}/config", responses=_LOOKUP)
    async def model_config(name: str) -> Response:
        return answer(lambda: plane.model_config(name, None))

    @router.get("/v2/models/{name}/versions/{v}/config", responses=_LOOKUP)
    async def version_config(name: str, v: str) -> Response:
        return answer(lambda: plane.model_config(name, v))

    @router.get("/v2/models/{name}", responses=_METADATA)
    async def model_metadata(name: str) -> Response:
        return answer(lambda: plane.model_metadata(name, None))

    @router.get("/v2/models/{name}/versions/{v}", responses=_METADATA)
    async def version_metadata(name: str, v: str) -> Response:
        return answer(lambda: plane.model_metadata(name, v))

    @router.get("/v2/models/{name}/ready", responses={**_LOOKUP, **_NOT_READY})
    async def is_model_ready(name: str) -> Response:
        return await model_ready(name, None)

    @router.get("/v2/models/{name}/versions/{v}/ready", responses={**_LOOKUP, **_NOT_READY})
    async def is_version_ready(name: str, v: str) -> Response:
        return await model_ready(name, v)

    @router.post("/v2/models/{name}/infer", responses=_INFER, openapi_extra=_INFER_BODY)
    async def infer(name: str, request: Request) -> Response:
        return await tracked(name, None, request)

    @router.post("/v2/models/{name}/versions/{v}/infer", responses=_INFER, openapi_extra=_INFER_BODY)
    async def infer_version(name: str, v: str, request: Request) -> Response:
        return await tracked(name, v, request)

    return router
