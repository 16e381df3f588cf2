"""Central's REST API (``/api/v1``) and health. Routes only translate HTTP to calls
on ``Central`` and back; every error becomes ``{"error": "…"}`` with its status."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from central.auth import OperatorAuth, actor_of
from central.auth.middleware import is_write, protects
from central.core import Central
from central.dashboard import create_dashboard_router
from central.errors import CentralError, NotFound, StoreUnavailable, unavailable_store_errors
from central.events import operator_event
from central.gateway import create_gateway_router
from central.membership.liveness import NodeView
from central.observability import create_metrics_router
from central.storage.protocols import VersionRecord
from central.transport.drift_routes import create_drift_router
from central.transport.limits import JsonBodyLimit, UploadLimit
from central.transport.push_options import push_options
from central.transport.push_stream import progress_stream
from central.transport.rollout_routes import create_rollout_router
from central.transport.transfer_routes import create_transfer_router
from central.transport.uploads import parse_flag, receive_push
from fleetwire.manifest import Manifest

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """The one error shape of every route: ``{"error": "…"}``."""

    error: str


#: Declared on every route so that the OpenAPI document says what an error looks like
#: (and replaces FastAPI's default 422 shape, which the handlers below never send).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 404, 405, 409, 413, 422)
}
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


def _version_summary(r: VersionRecord) -> dict[str, Any]:
    m = r.manifest
    return {
        "name": r.name,
        "version": r.version,
        "seq": r.seq,
        "size": m.size,
        "total_size": m.served().total_size,
        "files": [f.path for f in m.files],
        "sha256": m.sha256,
        "chunks": len(m.chunks),
        "labels": m.labels,
        "artifact": m.artifact,
        "artifacts": sorted(r.artifacts),
        "quantization": m.quantization,
        "created_at": r.created_at,
    }


def _membership_entry(v: NodeView) -> dict[str, Any]:
    return {
        "node_id": v.node_id,
        "state": str(v.state),
        "last_heartbeat_age_s": v.last_heartbeat_age_s,
        "bdseq": v.bdseq,
        "interval_s": v.interval_s,
        "grpc_address": v.grpc_address,
        "http_address": v.http_address,
        "hardware_class": v.hardware_class,
        "models": [m.model_dump() for m in v.models],
        "load": v.load.model_dump() if v.load is not None else None,
        "cache": v.cache.model_dump() if v.cache is not None else None,
    }


def _served_artifacts(view: NodeView | None) -> list[dict[str, Any]]:
    """The artifact each version is served as on a node, why, and its speed-up over FP32
    (from its last heartbeat; empty before one)."""
    if view is None:
        return []
    return [
        {"model": m.name, "version": m.version, **m.choice.model_dump()} for m in view.models if m.choice is not None
    ]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CentralError)
    async def central_error(_: Request, exc: CentralError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.http_status, headers=exc.http_headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    store_away = unavailable_store_errors()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, store_away):  # PostgreSQL or S3 restarting: nothing was written
            log.warning("store unavailable: %s", exc)
            away = StoreUnavailable(f"the store is unavailable ({type(exc).__name__}); retry shortly")
            return JSONResponse({"error": away.message}, status_code=503, headers=away.http_headers)
        log.exception("unexpected error")
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)


def _install_auth(app: FastAPI, central: Central) -> None:
    """Operator tokens (``auth.enabled``): outermost, so a refused write reads no body."""
    auth = central.settings.auth
    if not auth.enabled:
        return
    store = central.operator_tokens
    assert store is not None  # opened by Central when auth is enabled
    if not store.records():
        log.warning("auth is on but %s holds no token: create one with `modelfleet token create`", store.location)
    app.add_middleware(OperatorAuth, store=store, protect_reads=auth.protect_reads)
    _declare_auth(app, auth.protect_reads)


_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def _declare_auth(app: FastAPI, protect_reads: bool) -> None:
    """Declare in the OpenAPI document the 401 (every protected operation) and 403 (writes:
    a viewer's token) that ``OperatorAuth`` answers before any route runs."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                if method not in _METHODS or not protects(method.upper(), path, protect_reads):
                    continue
                responses = operation.setdefault("responses", {})
                responses["401"] = {"description": "No token, or one central does not know", "content": _ERROR_REF}
                if is_write(method.upper()):
                    responses["403"] = {"description": "A viewer's token: writes need admin", "content": _ERROR_REF}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(central: Central) -> FastAPI:
    """The FastAPI application for one ``Central``."""
    app = FastAPI(title="modelfleet central", version="0.1.0", responses=ERROR_RESPONSES)
    _install_error_handlers(app)
    app.add_middleware(JsonBodyLimit, max_bytes=central.settings.max_json_body_bytes)
    # Inside auth (a refused write takes no slot), around the whole push: the slot is held
    # until the response ends, streamed (?progress=ndjson) or not, whatever ends it.
    app.add_middleware(UploadLimit, limit=central.settings.max_concurrent_uploads)
    _install_auth(app, central)
    registry = central.registry

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready to take traffic: the broker link (when MQTT is on) and, on a replica, the
        control session and the fleet feed are up; says leadership and owned partitions."""
        body = central.readiness()
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/api/v1/replicas")
    async def replicas() -> dict[str, Any]:
        """The live replicas of a replicated central (one entry, this process, otherwise)."""
        return central.replicas()

    @app.get("/api/v1/models")
    async def list_models() -> list[dict[str, Any]]:
        return [vars(m) for m in registry.list_models()]

    @app.get("/api/v1/models/{name}/versions")
    async def list_versions(name: str) -> list[dict[str, Any]]:
        return [_version_summary(r) for r in registry.list_versions(name)]

    @app.post("/api/v1/models/{name:anyname}/versions", status_code=201, response_model=None, responses=PUSH_RESPONSES)
    async def push(name: str, request: Request) -> dict[str, Any] | Response:
        """Push a model version. The body is a self-contained ``.onnx``; or a tar (plain or
        gzipped) of a directory holding one ``.onnx`` and its external-data files; or a
        ``multipart/form-data`` with every file of the model as ``file`` (or ``data``) parts,
        each under the name the graph uses (``model.onnx.data``), plus optional ``calibration``
        (.npz), ``version``, ``labels`` and ``keep_fp32`` fields. Streamed to disk, never held
        in memory; ``max_upload_bytes`` counts every file."""
        registry.check_request(name, request.query_params.get("version"))
        activate = parse_flag("activate", request.query_params.get("activate") or "true")
        options = push_options(request.query_params)  # threshold, dim: quantization options
        actor = actor_of(request)
        pushed = await receive_push(request, central.staging)

        async def commit() -> dict[str, Any]:
            calibration = pushed.calibration.path if pushed.calibration else None
            try:
                central.rollouts.before_push(name, activate)
                result = await registry.push(
                    name,
                    pushed.version,
                    pushed.labels,
                    pushed.upload,
                    calibration=calibration,
                    keep_fp32=pushed.keep_fp32,
                    eval_data=pushed.eval_data.path if pushed.eval_data else None,
                    threshold=options.threshold,
                    dims=options.dims,
                    in_commit=central.rollouts.activation(name) if activate else None,
                )
            finally:
                pushed.discard()
            m = result.manifest
            detail = {"model": name, "version": m.version, "sha256": m.sha256, "size": m.size, "activate": activate}
            central.events.record(operator_event("model_pushed", actor, detail))
            if activate:  # before the coalesced refresh runs: one plan, the new stable version
                central.rollouts.activated(name, m.version, actor)
            return {"manifest": result.manifest.model_dump(), "report": result.report}

        if request.query_params.get("progress") == "ndjson":  # opt-in: steps as they happen
            return progress_stream(commit, central)
        return await commit()

    @app.get("/api/v1/models/{name}/versions/{version}", response_model=Manifest)
    async def get_manifest(name: str, version: str, artifact: str | None = None) -> dict[str, Any]:
        record = registry.get(name, version)
        if artifact is None:
            return record.manifest.model_dump()
        if artifact not in record.artifacts:
            raise NotFound(f"{name}:{version} has no {artifact!r} artifact; it has: {', '.join(record.artifacts)}")
        return record.artifacts[artifact].model_dump()

    @app.delete("/api/v1/models/{name}/versions/{version}", status_code=204)
    async def delete_version(name: str, version: str, request: Request) -> Response:
        central.rollouts.check_deletable(name, version)
        await registry.delete(name, version)
        detail = {"model": name, "version": version}
        central.events.record(operator_event("version_deleted", actor_of(request), detail))
        return Response(status_code=204)

    @app.get("/api/v1/nodes")
    async def list_nodes() -> list[dict[str, Any]]:
        placement = central.placement
        return [
            {
                "node_id": n.node_id,
                "grpc_address": n.grpc_address,
                "http_address": n.http_address,
                "capacity": n.capacity,
                "labels": n.labels,
                "hardware_class": n.hardware_class,
                "site": n.site,
                "artifacts": _served_artifacts(central.membership.get(n.node_id)),
                "owned_chunks": len(placement.owned_by(n.node_id)),
            }
            for n in central.nodes.nodes()
        ]

    @app.get("/api/v1/verdicts")
    async def list_verdicts() -> list[dict[str, Any]]:
        # Which artifact each hardware class serves, as the first node of the class timed it.
        return central.verdicts.all()

    @app.get("/api/v1/membership")
    async def membership(summary: bool = False) -> Response:
        # Serialised with orjson straight from the node views: FastAPI's generic encoder
        # took seconds for a 10k-node fleet, during which the loop heard no heartbeats.
        # summary=true leaves the per-node list out (dashboards' and benchmarks' polls).
        tracker = central.membership
        body: dict[str, Any] = {"counts": tracker.counts(), "counters": tracker.counters.as_dict()}
        if central.mqtt is not None:
            body["inbound_lag_s"] = round(central.mqtt.probe.lag(), 4)
        if not summary:
            body["nodes"] = [_membership_entry(v) for v in tracker.nodes()]
        return Response(orjson.dumps(body), media_type="application/json")

    @app.get("/api/v1/events")
    async def events(limit: int = 100, since: int | None = None) -> list[dict[str, Any]]:
        # Without since: the last `limit` events. With since: the first `limit` kept events
        # numbered above it (a page; the next one starts after the last seq returned).
        limit = max(1, min(limit, 10_000))
        tracker = central.membership
        found = tracker.events(limit) if since is None else tracker.events_since(since, limit)
        return [e.model_dump() for e in found]

    @app.get("/api/v1/stats")
    async def stats() -> dict[str, Any]:
        o = central.origin.stats
        return {
            "generation": central.desired.generation,
            "origin": {
                "bytes_sent": o.bytes_sent,
                "chunks_sent": o.chunks_sent,
                "refused": o.refused,
                "denied": o.denied,
                "bytes_by_node": dict(o.bytes_by_node),
            },
        }

    app.include_router(create_metrics_router(central.metrics))
    app.include_router(create_dashboard_router(central.dashboard))
    app.include_router(create_rollout_router(central.rollouts))
    app.include_router(create_drift_router(central.drift))
    app.include_router(create_transfer_router(central.transfer, central.events.record))
    if central.settings.gateway.enabled:
        app.include_router(create_gateway_router(central.gateway, central.registry.describe))
    return app
