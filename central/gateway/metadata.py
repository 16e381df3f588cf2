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

from central.gateway.candidates import ModelCatalog
from central.gateway.outcomes import failure_of, node_error
from central.gateway.proxy import NODE_HEADER, GatewayProxy, GatewayResponse
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


def json_answer(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> GatewayResponse:
    """A JSON document as the gateway's answer."""
    return GatewayResponse(status, {"content-type": "application/json", **(headers or {})}, orjson.dumps(doc))


def _what(model: str, version: str | None) -> str:
    return f"model {model!r}" + (f" (version {version!r})" if version is not None else "")


def _invalid(model: str, version: str | None) -> GatewayResponse | None:
    """422 naming the rule for a name no model can have (as the inference routes do)."""
    try:
        check_name("model name", model)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        return json_answer({"error": str(exc)}, 422)
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


async def _not_served(model: str, version: str | None, suffix: str, catalog: ModelCatalog | None) -> GatewayResponse:
    """The registry's metadata of a model no node serves; 404 for its config or an unknown model."""
    found = await catalog(model, version) if catalog is not None and suffix == "" else None
    if found is None:
        return json_answer({"error": f"{_what(model, version)} is not served by any alive node"}, 404)
    return json_answer(catalog_metadata(*found))


async def node_document(
    proxy: GatewayProxy, model: str, version: str | None, suffix: str, catalog: ModelCatalog | None = None
) -> GatewayResponse:
    """``GET`` ``suffix`` ("" for metadata, "/config") of the model from the first node that
    answers it; nodes that fail or no longer serve it are skipped. With no node serving it,
    the metadata comes from ``catalog`` (central's registry) when it knows the model."""
    if (invalid := _invalid(model, version)) is not None:
        return invalid
    candidates = proxy.router.order(model, version)
    if not candidates:
        return await _not_served(model, version, suffix, catalog)
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
        return _passed(answer.content, answer.status_code, candidate.node_id)
    if not_found is not None:
        node, answer = not_found
        return _passed(answer.content, 404, node)
    return json_answer({"error": f"no node answered for {_what(model, version)}: {reason}"}, 503, {"Retry-After": "1"})


def _passed(body: bytes, status: int, node_id: str) -> GatewayResponse:
    """A node's answer, passed on as it came, naming the node."""
    return GatewayResponse(status, {"content-type": "application/json", NODE_HEADER: node_id}, body)


def gateway_server_metadata() -> dict[str, Any]:
    """The gateway's OIP server metadata document: name, version, extensions."""
    return {"name": SERVER_NAME, "version": _version(), "extensions": EXTENSIONS}


def model_ready(proxy: GatewayProxy, model: str, version: str | None) -> GatewayResponse:
    """Ready when a node that can take requests reports ``model`` (``version``) ready."""
    if (invalid := _invalid(model, version)) is not None:
        return invalid
    ready = bool(proxy.router.order(model, version))
    return json_answer({"name": model, "ready": ready}, 200 if ready else 400)
