"""Edge HTTP routes: inference (Open Inference Protocol), metrics, health and a status
document (versions, cache, fetch counters). Routes read from the parts they are given
and never do work themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from edge_node.heartbeat import LoadTracker
from edge_node.inference import CONTENT_TYPE_LATEST, ModelRepository
from edge_node.oip import OipLimits, create_oip_router
from edge_node.settings import LimitSettings


def create_app(
    repository: ModelRepository,
    load: LoadTracker,
    status_document: Callable[[], dict[str, Any]],
    caps: LimitSettings,
    *,
    bench_endpoints: bool = False,
) -> FastAPI:
    """The FastAPI application of one edge: inference on ``repository`` (its requests
    counted by ``load``), ``status_document()`` on ``/api/v1/status``, request caps ``caps``."""
    # FastAPI's built-in OpenTelemetry costs microseconds per request on the inference
    # hot path; an edge exports Prometheus metrics instead.
    app = FastAPI(
        title="modelfleet edge", version="0.1.0", telemetry={"tracing": False, "metrics": False, "logs": False}
    )
    limits = OipLimits(
        max_body_bytes=caps.max_infer_body_bytes,
        max_tensor_elements=caps.max_tensor_elements,
        max_inflight_requests=caps.max_inflight_infer_requests,
    )
    app.include_router(create_oip_router(repository, version="0.1.0", load=load, limits=limits))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(repository.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    if bench_endpoints:

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
        return status_document()

    return app
