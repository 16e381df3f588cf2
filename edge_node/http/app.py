"""Edge HTTP routes: health and a status document (versions, cache, fetch counters).
Routes read from the ``Edge`` object and never do work themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from edge_node.inference import CONTENT_TYPE_LATEST
from edge_node.oip import OipLimits, create_oip_router

if TYPE_CHECKING:
    from edge_node.server import Edge


def create_app(edge: Edge) -> FastAPI:
    """The FastAPI application of one edge."""
    # FastAPI's built-in OpenTelemetry costs microseconds per request on the inference
    # hot path; an edge exports Prometheus metrics instead.
    app = FastAPI(
        title="modelfleet edge", version="0.1.0", telemetry={"tracing": False, "metrics": False, "logs": False}
    )
    caps = edge.settings.limits
    limits = OipLimits(
        max_body_bytes=caps.max_infer_body_bytes,
        max_tensor_elements=caps.max_tensor_elements,
        max_inflight_requests=caps.max_inflight_infer_requests,
    )
    app.include_router(create_oip_router(edge.repository, version="0.1.0", load=edge.load, limits=limits))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(edge.repository.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    if edge.settings.inference.bench_endpoints:

        @app.post("/bench/noop")
        async def noop(request: Request) -> Response:
            """Reads the body like /infer does and answers a fixed small document: the
            ceiling of this HTTP stack, for the serving benchmark."""
            await request.body()
            return Response(b'{"outputs":[]}', media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/status")
    async def status() -> dict[str, Any]:
        return edge.status()

    return app
