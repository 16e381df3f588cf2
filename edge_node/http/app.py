"""Edge HTTP routes: health and a status document (versions, cache, fetch counters).
Routes read from the ``Edge`` object and never do work themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

if TYPE_CHECKING:
    from edge_node.server import Edge


def create_app(edge: Edge) -> FastAPI:
    """The FastAPI application of one edge."""
    app = FastAPI(title="modelfleet edge", version="0.1.0")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/status")
    async def status() -> dict[str, Any]:
        return edge.status()

    return app
