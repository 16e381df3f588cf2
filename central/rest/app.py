"""Central's REST API (``/api/v1``), the gateway's ``/v2`` and health. Routes only translate
HTTP to calls on ``central.handlers`` and back; every error becomes ``{"error": "…"}`` with
its status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from central.dashboard import create_dashboard_router
from central.handlers import ApiHandlers
from central.rest.auth import OperatorAuth, is_write, protects, stream_guard
from central.rest.errors import ERROR_RESPONSES, install_error_handlers
from central.rest.fleet_routes import create_fleet_router
from central.rest.gateway_routes import create_gateway_router
from central.rest.limits import JsonBodyLimit, UploadLimit, is_upload
from central.rest.metrics_routes import create_metrics_router
from central.rest.registry_routes import create_registry_router
from central.rest.rollout_routes import create_rollout_router
from central.rest.text_routes import create_text_router
from central.settings import AuthSettings, CentralSettings
from central.storage.offload import StoreCalls
from central.storage.protocols import Tokens
from fleetwire.body_deadline import BodyDeadline

log = logging.getLogger(__name__)


def _install_auth(app: FastAPI, auth: AuthSettings, store: Tokens | None, calls: StoreCalls) -> None:
    """Operator tokens (``auth.enabled``): outermost, so a refused write reads no body."""
    if not auth.enabled:
        return
    assert store is not None  # opened with the stores when auth is enabled
    if not store.records():
        log.warning("auth is on but %s holds no token: create one with `modelfleet token create`", store.location)
    app.add_middleware(OperatorAuth, store=store, calls=calls, protect_reads=auth.protect_reads)
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


def create_app(handlers: ApiHandlers, settings: CentralSettings) -> FastAPI:
    """The FastAPI application over one central's ``handlers``."""
    app = FastAPI(title="modelfleet central", version="0.1.0", responses=ERROR_RESPONSES)
    install_error_handlers(app)
    app.add_middleware(JsonBodyLimit, max_bytes=settings.max_json_body_bytes)
    # Inside auth (a refused write takes no slot), around the whole push: the slot is held
    # until the response ends, streamed (?progress=ndjson) or not, whatever ends it.
    app.add_middleware(UploadLimit, limit=settings.max_concurrent_uploads)
    _install_auth(app, settings.auth, handlers.operator_tokens, handlers.store_calls)
    # Outermost: every body, the gateway's included, arrives within body_timeout_s (a push:
    # between two pieces) or the client gets 408 and the connection closes.
    app.add_middleware(
        BodyDeadline,
        timeout_s=settings.body_timeout_s,
        idle_only=lambda scope: is_upload(scope["method"], scope.get("path", "")),
    )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(create_registry_router(handlers.registry))
    app.include_router(create_fleet_router(handlers.fleet, handlers.health))
    app.include_router(create_metrics_router(handlers.metrics))
    auth, tokens = settings.auth, handlers.operator_tokens
    guard = (
        stream_guard(tokens, handlers.store_calls)
        if auth.enabled and auth.protect_reads and tokens is not None
        else None
    )
    app.include_router(create_dashboard_router(handlers.dashboard, guard))
    app.include_router(create_rollout_router(handlers.rollouts))
    if settings.gateway.enabled:
        app.include_router(create_text_router(handlers.gateway, handlers.text))
        app.include_router(create_gateway_router(handlers.gateway, handlers.catalog, handlers.text))
    return app
