"""The gateway's KServe v2 / Triton health and metadata endpoints, so a client written for
Triton or KServe (``tritonclient``'s ``is_server_live``, ``get_model_metadata``…) works
against central as it does against one edge.

- ``GET /v2/health/live`` and ``/v2/health/ready``: the gateway itself. It is ready while
  it accepts requests; whether a model can be served is that model's ``…/ready``.
- ``GET /v2``: server metadata (``modelfleet-gateway``, its version and extensions).
- ``GET /v2/models/{m}[/versions/{v}]/ready``: 200 ``{"name", "ready": true}`` when an
  alive node reports the model (version) ready and its breaker lets requests through;
  otherwise 400 ``{"ready": false}`` (KServe: a 4xx means "not ready"). Answered from
  heartbeats, without a request to a node.
- ``GET /v2/models/{m}[/versions/{v}]`` and ``…/config``: the metadata and Triton model
  configuration of a node that serves the model, passed through as it answered. Asking
  runs no model, so any failure moves on to the next node. When no node serves it (yet),
  the metadata comes from central's registry (the version's manifest, in the words an edge
  uses, without ``X-Modelfleet-Node``): a client can learn a model's inputs while it is
  still on its way to the edges. 404 when neither knows it."""

from __future__ import annotations

from importlib import metadata as package_metadata
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel

from central.gateway.candidates import ModelCatalog
from central.gateway.outcomes import failure_of, node_error
from central.gateway.proxy import NODE_HEADER, GatewayProxy
from fleetwire.datatypes import oip_datatype
from fleetwire.manifest import Manifest, TensorSpec
from fleetwire.names import InvalidName, check_name

SERVER_NAME = "modelfleet-gateway"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]


def _version() -> str:
    try:
        return package_metadata.version("modelfleet")
    except package_metadata.PackageNotFoundError:
        return "0"


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def _what(model: str, version: str | None) -> str:
    return f"model {model!r}" + (f" (version {version!r})" if version is not None else "")


def _invalid(model: str, version: str | None) -> Response | None:
    """422 naming the rule for a name no model can have (as the inference routes do)."""
    try:
        check_name("model name", model)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        return _json({"error": str(exc)}, 422)
    return None


def _model_path(model: str, version: str | None, suffix: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    if version is not None:
        path += f"/versions/{quote(version, safe='')}"
    return path + suffix


def _tensors(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": oip_datatype(s.dtype), "shape": s.shape} for s in specs]


def catalog_metadata(manifest: Manifest, versions: list[str]) -> dict[str, Any]:
    """The OIP model metadata of a stored version, as an edge that serves it would answer."""
    return {
        "name": manifest.name,
        "versions": versions,
        "platform": "onnxruntime_onnx",
        "inputs": _tensors(manifest.inputs),
        "outputs": _tensors(manifest.outputs),
    }


def _not_served(model: str, version: str | None, suffix: str, catalog: ModelCatalog | None) -> Response:
    """The registry's metadata of a model no node serves; 404 for its config or an unknown model."""
    found = catalog(model, version) if catalog is not None and suffix == "" else None
    if found is None:
        return _json({"error": f"{_what(model, version)} is not served by any alive node"}, 404)
    return _json(catalog_metadata(*found))


async def node_document(
    proxy: GatewayProxy, model: str, version: str | None, suffix: str, catalog: ModelCatalog | None = None
) -> Response:
    """``GET`` ``suffix`` ("" for metadata, "/config") of the model from the first node that
    answers it; nodes that fail or no longer serve it are skipped. With no node serving it,
    the metadata comes from ``catalog`` (central's registry) when it knows the model."""
    if (invalid := _invalid(model, version)) is not None:
        return invalid
    candidates = proxy.router.order(model, version)
    if not candidates:
        return _not_served(model, version, suffix, catalog)
    timeout = httpx.Timeout(proxy.read_timeout_s, connect=proxy.connect_timeout_s)
    path = _model_path(model, version, suffix)
    reason = ""
    not_found: tuple[str, httpx.Response] | None = None
    for candidate in candidates[: proxy.attempts]:
        try:
            answer = await proxy.client.get(proxy.node_url(candidate, path), timeout=timeout)
        except (httpx.RequestError, httpx.InvalidURL) as exc:
            reason = f"node {candidate.node_id}: {failure_of(exc).reason}"
            continue
        if answer.status_code == 404 or answer.status_code >= 500:
            reason = f"node {candidate.node_id} answered {answer.status_code}: {node_error(answer)}"
            if answer.status_code == 404 and not_found is None:
                not_found = (candidate.node_id, answer)
            continue
        return Response(answer.content, answer.status_code, media_type="application/json",
                        headers={NODE_HEADER: candidate.node_id})  # fmt: skip
    if not_found is not None:
        node, answer = not_found
        return Response(answer.content, 404, media_type="application/json", headers={NODE_HEADER: node})
    return _json({"error": f"no node answered for {_what(model, version)}: {reason}"}, 503, {"Retry-After": "1"})


def gateway_server_metadata() -> dict[str, Any]:
    """The gateway's OIP server metadata document: name, version, extensions."""
    return {"name": SERVER_NAME, "version": _version(), "extensions": EXTENSIONS}


def model_ready(proxy: GatewayProxy, model: str, version: str | None) -> Response:
    """Ready when a node that can take requests reports ``model`` (``version``) ready."""
    if (invalid := _invalid(model, version)) is not None:
        return invalid
    ready = bool(proxy.router.order(model, version))
    return _json({"name": model, "ready": ready}, 200 if ready else 400)


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


def create_metadata_router(proxy: GatewayProxy, catalog: ModelCatalog | None = None) -> APIRouter:
    """Health, server metadata, model readiness, metadata and configuration over ``proxy``;
    ``catalog`` describes models no node serves yet."""
    router = APIRouter()
    document = gateway_server_metadata()

    @router.get("/v2/health/live", responses={200: {"model": LiveBody}})
    async def live() -> Response:
        return _json({"live": True})

    @router.get("/v2/health/ready", responses={200: {"model": ReadyBody}})
    async def ready() -> Response:
        return _json({"ready": True})

    @router.get("/v2", responses={200: {"model": ServerMetadataBody}})
    async def server_metadata() -> Response:
        return _json(document)

    @router.get("/v2/models/{name}", responses=_DOCUMENT)
    async def metadata(name: str) -> Response:
        return await node_document(proxy, name, None, "", catalog)

    @router.get("/v2/models/{name}/versions/{v}", responses=_DOCUMENT)
    async def version_metadata(name: str, v: str) -> Response:
        return await node_document(proxy, name, v, "", catalog)

    @router.get("/v2/models/{name}/config", responses=_DOCUMENT)
    async def config(name: str) -> Response:
        return await node_document(proxy, name, None, "/config")

    @router.get("/v2/models/{name}/versions/{v}/config", responses=_DOCUMENT)
    async def version_config(name: str, v: str) -> Response:
        return await node_document(proxy, name, v, "/config")

    @router.get("/v2/models/{name}/ready", responses=_MODEL_READY)
    async def is_ready(name: str) -> Response:
        return model_ready(proxy, name, None)

    @router.get("/v2/models/{name}/versions/{v}/ready", responses=_MODEL_READY)
    async def is_version_ready(name: str, v: str) -> Response:
        return model_ready(proxy, name, v)

    return router
