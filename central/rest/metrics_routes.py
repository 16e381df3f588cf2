"""``GET /metrics``: central's metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from central.observability.instruments import CentralMetrics

__all__ = ["create_metrics_router"]


def create_metrics_router(metrics: CentralMetrics) -> APIRouter:
    """The scrape endpoint over ``metrics``' registry."""
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    async def scrape() -> Response:
        await metrics.refresh()  # the registry's figures, read in a store worker
        # Collected on the loop on purpose: the collector reads loop-owned state (tracker, ring).
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
