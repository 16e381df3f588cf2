"""REST routes of the fleet: readiness, replicas, nodes, membership, events, verdicts,
origin figures and edges' transfer caps. Each route is one handler call."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from central.handlers import FleetHandlers, HealthHandlers
from central.rest.auth import actor_of
from central.settings import TransferSettings


def create_fleet_router(fleet: FleetHandlers, health: HealthHandlers) -> APIRouter:
    """``/readyz`` and ``/api/v1`` routes about the fleet."""
    router = APIRouter()

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready to take traffic: the broker link (when MQTT is on) and, on a replica, the
        control session and the fleet feed are up; says leadership and owned partitions."""
        body = await health.readiness()
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @router.get("/api/v1/replicas")
    async def replicas() -> dict[str, Any]:
        """The live replicas of a replicated central (one entry, this process, otherwise)."""
        return health.replicas()

    @router.get("/api/v1/nodes")
    async def list_nodes() -> list[dict[str, Any]]:
        return fleet.nodes()

    @router.get("/api/v1/verdicts")
    async def list_verdicts() -> list[dict[str, Any]]:
        return fleet.verdicts()

    @router.get("/api/v1/membership")
    async def membership(summary: bool = False) -> Response:
        # Serialised with orjson straight from the node views: FastAPI's generic encoder
        # took seconds for a 10k-node fleet, during which the loop heard no heartbeats.
        # summary=true leaves the per-node list out (dashboards' and benchmarks' polls).
        return Response(orjson.dumps(fleet.membership(summary)), media_type="application/json")

    @router.get("/api/v1/events")
    async def events(limit: int = 100, since: int | None = None) -> list[dict[str, Any]]:
        return fleet.events(limit, since)

    @router.get("/api/v1/stats")
    async def stats() -> dict[str, Any]:
        return fleet.stats()

    @router.get("/api/v1/transfer", response_model=TransferSettings)
    async def transfer() -> dict[str, Any]:
        """Fleet, per-site and per-node caps (bytes/s; null: the edge's own setting, 0: no cap)."""
        return fleet.transfer()

    @router.put("/api/v1/transfer", response_model=TransferSettings)
    async def replace_transfer(body: TransferSettings, request: Request) -> dict[str, Any]:
        """Replace the whole policy; every connected edge gets its new caps in a desired state."""
        return await fleet.replace_transfer(body, actor_of(request))

    return router
