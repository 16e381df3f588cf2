"""OIP v2 HTTP routes. Each translates HTTP to one call on the model repository and
back; bodies are parsed and written with orjson, never through pydantic models, since
this is the hot path."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from edge_node.heartbeat.load import LoadTracker
from edge_node.inference.errors import (
    InferenceFailed,
    InvalidInputs,
    ModelNotFound,
    ModelNotReady,
    ModelUnavailable,
    QueueFull,
)
from edge_node.inference.repository import LoadedModel, ModelRepository
from edge_node.oip.body import DEFAULT_MAX_BODY_BYTES, read_body
from edge_node.oip.codec import HEADER_LENGTH, OipError, decode_request, encode_response
from edge_node.oip.config import triton_config
from edge_node.oip.datatypes import oip_datatype
from edge_node.oip.validate import check_request
from fleetwire.manifest import TensorSpec
from fleetwire.names import InvalidName, check_name

log = logging.getLogger(__name__)

SERVER_NAME = "modelfleet-edge"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]


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


def _tensor_meta(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": oip_datatype(s.dtype), "shape": s.shape} for s in specs]


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.strip().isdigit()):  # "²".isdigit() is True, int("²") raises
        raise OipError(f"Inference-Header-Content-Length must be a non-negative integer, got {raw!r}")
    return int(raw)


def _name_error(name: str, version: str | None) -> Response | None:
    """422 naming the rule when ``name`` or ``version`` is no valid name (a trailing newline,
    a slash…): central never stores such a model, so "not found" would hide the real mistake."""
    try:
        check_name("model name", name)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        return error_response(str(exc), 422)
    return None


def _lookup_error(exc: Exception) -> Response:
    if isinstance(exc, ModelNotFound):
        return error_response(str(exc), 404)
    if isinstance(exc, QueueFull):
        return error_response(str(exc), 503, {"Retry-After": str(max(1, round(exc.retry_after_s)))})
    return error_response(str(exc), 503)


@dataclass(frozen=True)
class OipLimits:
    """Caps on one inference request (the edge's ``limits`` settings)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_tensor_elements: int = 16 * 1024 * 1024
    max_inflight_requests: int = 128


async def _infer(
    repository: ModelRepository, name: str, version: str | None, request: Request, limits: OipLimits
) -> Response:
    try:
        body = await read_body(request, limits.max_body_bytes)  # before get(): no swap between lookup and infer
        model = repository.get(name, version)
        decoded = decode_request(body, _header_length(request), limits.max_tensor_elements)
        check_request(decoded, model.manifest.inputs, model.manifest.outputs)
        priority = decoded.parameters.get("priority", 0)
        outputs = await model.infer(decoded.inputs, priority=int(priority) if isinstance(priority, int) else 0)
    except (OipError, InvalidInputs) as exc:
        return error_response(str(exc), exc.status if isinstance(exc, OipError) else 400)
    except (ModelNotFound, ModelNotReady, ModelUnavailable, QueueFull) as exc:
        return _lookup_error(exc)
    except InferenceFailed as exc:
        log.warning("%s: %s", name, exc)
        return error_response(str(exc), 500)
    wanted = decoded.requested_outputs
    selected = {k: v for k, v in outputs.items() if wanted is None or k in wanted}
    payload, header_length = encode_response(model.name, model.version, decoded, selected)
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(
        payload, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(header_length)}
    )


def _model_metadata(model: LoadedModel, versions: list[str]) -> dict[str, Any]:
    return {
        "name": model.name,
        "versions": versions,
        "platform": "onnxruntime_onnx",
        "inputs": _tensor_meta(model.manifest.inputs),
        "outputs": _tensor_meta(model.manifest.outputs),
    }


def create_oip_router(
    repository: ModelRepository, version: str, load: LoadTracker | None = None, limits: OipLimits | None = None
) -> APIRouter:
    """The ``/v2`` routes over one repository; ``load`` (if given) sees every inference;
    ``limits`` caps request bodies and tensor sizes (413 beyond)."""
    router = APIRouter()
    caps = limits or OipLimits()

    inflight = 0

    async def tracked(name: str, model_version: str | None, request: Request) -> Response:
        # Every request in progress may hold a whole body; each model's batcher bounds its
        # queue in rows, this bounds the requests in front of (and inside) all of them.
        nonlocal inflight
        if (invalid := _name_error(name, model_version)) is not None:
            return invalid
        if inflight >= caps.max_inflight_requests:
            message = (
                f"{inflight} inference requests are in progress here (limits.max_inflight_infer_requests);"
                " retry shortly"
            )
            return error_response(message, 503, {"Retry-After": "1"})
        inflight += 1
        try:
            if load is None:
                return await _infer(repository, name, model_version, request, caps)
            started = load.begin()
            try:
                return await _infer(repository, name, model_version, request, caps)
            finally:
                load.end(started)
        except ClientDisconnect:
            raise  # nobody to answer
        except Exception as exc:  # a bug here must still answer in the OIP error shape
            log.exception("inference request for %s failed", name)
            return error_response(f"the edge failed on this request: {type(exc).__name__}: {exc}", 500)
        finally:
            inflight -= 1

    @router.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": True})

    @router.get("/v2/health/ready", responses=_NOT_READY)
    async def ready() -> Response:
        is_ready = repository.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 400)

    @router.get("/v2", responses={200: {"model": ServerMetadata}})
    async def server_metadata() -> Response:
        return json_response({"name": SERVER_NAME, "version": version, "extensions": EXTENSIONS})

    def ready_model(name: str, model_version: str | None) -> LoadedModel | Response:
        """The served model, or the error response a bad name or a missing model gets."""
        if (invalid := _name_error(name, model_version)) is not None:
            return invalid
        try:
            return repository.get(name, model_version)
        except (ModelNotFound, ModelNotReady) as exc:
            return _lookup_error(exc)

    async def metadata(name: str, model_version: str | None) -> Response:
        model = ready_model(name, model_version)
        if isinstance(model, Response):
            return model
        versions = sorted({m.version for m in repository.models() if m.name == name and m.state == "ready"})
        return json_response(_model_metadata(model, versions))

    async def model_ready(name: str, model_version: str | None) -> Response:
        if (invalid := _name_error(name, model_version)) is not None:
            return invalid
        try:
            repository.get(name, model_version)
        except ModelNotFound as exc:
            return error_response(str(exc), 404)
        except ModelNotReady:
            return json_response({"name": name, "ready": False}, 400)
        return json_response({"name": name, "ready": True})

    async def config(name: str, model_version: str | None) -> Response:
        model = ready_model(name, model_version)
        if isinstance(model, Response):
            return model
        return json_response(triton_config(model, repository))

    @router.get("/v2/models/{name}/config", responses=_LOOKUP)
    async def model_config(name: str) -> Response:
        return await config(name, None)

    @router.get("/v2/models/{name}/versions/{v}/config", responses=_LOOKUP)
    async def version_config(name: str, v: str) -> Response:
        return await config(name, v)

    @router.get("/v2/models/{name}", responses=_METADATA)
    async def model_metadata(name: str) -> Response:
        return await metadata(name, None)

    @router.get("/v2/models/{name}/versions/{v}", responses=_METADATA)
    async def version_metadata(name: str, v: str) -> Response:
        return await metadata(name, v)

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
