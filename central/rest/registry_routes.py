"""REST routes of the registry: push (plain, or ``?progress=ndjson``), list, describe and
delete model versions. Each route is one ``RegistryHandlers`` call."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.convertors import Convertor, register_url_convertor

from central.handlers import RegistryHandlers
from central.rest.auth import actor_of
from central.rest.errors import ErrorBody
from central.rest.push_options import push_options
from central.rest.push_stream import progress_stream
from central.rest.uploads import parse_flag, receive_push
from fleetwire.manifest import Manifest

#: A push refused because ``max_concurrent_uploads`` pushes are in progress.
PUSH_RESPONSES: dict[int | str, dict[str, Any]] = {
    507: {"model": ErrorBody, "description": "Central's disk cannot hold the upload and its chunks"},
    503: {
        "model": ErrorBody,
        "description": "Too many pushes in progress (max_concurrent_uploads); retry after Retry-After seconds",
        "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
    },
}


class _AnyNameConvertor(Convertor[str]):
    """Any text, slashes and line breaks included (``path`` stops at a newline): a pushed name
    reaches the name check and its 422, not a bare 405 from a route that did not match."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anyname", _AnyNameConvertor())


def create_registry_router(registry: RegistryHandlers) -> APIRouter:
    """``/api/v1/models…``: the registry's routes."""
    router = APIRouter(prefix="/api/v1")

    @router.get("/models")
    async def list_models() -> list[dict[str, Any]]:
        return await registry.list_models()

    @router.get("/models/{name}/versions")
    async def list_versions(name: str) -> list[dict[str, Any]]:
        return await registry.list_versions(name)

    @router.post("/models/{name:anyname}/versions", status_code=201, response_model=None, responses=PUSH_RESPONSES)
    async def push(name: str, request: Request) -> dict[str, Any] | Response:
        """Push a model version. The body is a self-contained ``.onnx``; or a tar (plain or
        gzipped) of a directory holding one ``.onnx`` and its external-data files; or a
        ``multipart/form-data`` with every file of the model as ``file`` (or ``data``) parts,
        each under the name the graph uses (``model.onnx.data``), plus optional ``calibration``
        (.npz), ``version``, ``labels`` and ``keep_fp32`` fields. Streamed to disk, never held
        in memory; ``max_upload_bytes`` counts every file."""
        query = request.query_params
        await registry.check_push(name, query.get("version"))
        activate = parse_flag("activate", query.get("activate") or "true")
        options = push_options(query)  # threshold, dim: quantization options
        actor = actor_of(request)
        pushed = await receive_push(request, registry.staging)

        async def commit() -> dict[str, Any]:
            return await registry.push(name, pushed, options, activate=activate, actor=actor)

        if query.get("progress") == "ndjson":  # opt-in: steps as they happen
            return progress_stream(commit, registry)
        return await commit()

    @router.get("/models/{name}/versions/{version}", response_model=Manifest)
    async def get_manifest(name: str, version: str, artifact: str | None = None) -> dict[str, Any]:
        return await registry.manifest(name, version, artifact)

    @router.delete("/models/{name}/versions/{version}", status_code=204)
    async def delete_version(name: str, version: str, request: Request) -> Response:
        await registry.delete(name, version, actor_of(request))
        return Response(status_code=204)

    return router
