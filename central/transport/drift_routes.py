"""REST routes of INT8 on live traffic: what edges measured per version and node, and an
operator's way to accept INT8 again after a fallback. Thin: each calls ``DriftWatch``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from central.registry.service import check_name
from central.rollout.drift import DriftWatch


def create_drift_router(drift: DriftWatch) -> APIRouter:
    """``/api/v1/models/{name}/versions/{version}/agreement`` (GET: the figures; DELETE: clear)."""
    router = APIRouter(prefix="/api/v1")

    @router.get("/models/{name}/versions/{version}/agreement")
    async def agreement(name: str, version: str) -> dict[str, Any]:
        """Live agreement of the version's INT8 with FP32, per node and pooled, and the fallbacks."""
        check_name("model name", name)
        check_name("version", version)
        return drift.report(name, version)

    @router.delete("/models/{name}/versions/{version}/agreement")
    async def clear(name: str, version: str) -> dict[str, Any]:
        """Forget the version's flags and fallbacks: its nodes serve their own choice again."""
        check_name("model name", name)
        check_name("version", version)
        return {"model": name, "version": version, "cleared_nodes": drift.clear(name, version)}

    return router
