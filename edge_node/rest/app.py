"""Edge HTTP routes: inference (Open Inference Protocol), metrics, health and a status
document (versions, cache, fetch counters). Routes read from the parts they are given
and never do work themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import PlainTextResponse, Response

from edge_node.generation.service import LanguageModels
from edge_node.inference import CONTENT_TYPE_LATEST
from edge_node.inference.dataplane import DataPlane
from edge_node.rest.fastpath import InferFastPath
from edge_node.rest.generate_routes import create_generate_routes
from edge_node.rest.openai_routes import create_openai_routes
from edge_node.rest.routes import create_oip_routes

#: Smallest response body gzip-compressed (a few generated paragraphs).
GZIP_MIN_BYTES = 1024


def create_app(
    plane: DataPlane,
    status_document: Callable[[], dict[str, Any]],
    *,
    language: LanguageModels | None = None,
    bench_endpoints: bool = False,
) -> InferFastPath:
    """The ASGI application of one edge: OIP v2 over ``plane`` (the inference service the
    gRPC transport shares), ``status_document()`` on ``/api/v1/status``. Inference (and the
    bench no-op) is answered by :class:`InferFastPath`; the rest, and the OpenAPI document,
    by the FastAPI app it wraps (``.fastapi``). With ``language``, the text APIs too: the
    OpenAI-compatible ``/v1`` routes and OIP's generate extension; their non-streamed answers
    are gzip-compressed when the client accepts it and they are large."""
    repository = plane.repository
    # FastAPI's built-in OpenTelemetry costs microseconds per request on the inference
    # hot path; an edge exports Prometheus metrics instead.
    app = FastAPI(
        title="modelfleet edge", version="0.1.0", telemetry={"tracing": False, "metrics": False, "logs": False}
    )
    app.include_router(create_oip_routes(plane))
    if language is not None:
        app.include_router(create_openai_routes(language))
        app.include_router(create_generate_routes(language))
        # Starlette leaves text/event-stream uncompressed, so streams keep flowing token by token.
        app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(repository.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/status")
    async def status() -> dict[str, Any]:
        return status_document()

    # POST /bench/noop (bench_endpoints) is answered by the fast path only.
    return InferFastPath(app, plane, bench_endpoints=bench_endpoints)
