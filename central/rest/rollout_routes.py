"""REST routes of staged rollouts (contract: the rollout section of the operator API) and of
INT8 on live traffic (agreement). Thin: each route is one ``RolloutHandlers`` call."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict

from central.handlers import RolloutHandlers
from central.rest.auth import actor_of
from central.rollout import RolloutRequest

#: The dry run answers 200, not the start's 201.
_DRY_RUN_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "With ?dry_run=true: what the rollout would fetch, per node and site; nothing started"}
}


class FlipRequest(BaseModel):
    """The body of ``POST /api/v1/models/{name}/rollout/flip``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    at: AwareDatetime | None = None
    """When the staged nodes switch, on central's clock (ISO 8601 with a zone); None: as soon as
    the flip reaches every node (``rollout.flip_lead_s`` from now)."""


class RetryRequest(BaseModel):
    """The body of ``POST /api/v1/models/{name}/rollout/retry``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    nodes: list[str] | None = None
    """The failed nodes to retry; None: every failed node."""


def create_rollout_router(rollouts: RolloutHandlers) -> APIRouter:
    """``/api/v1`` routes that start, show, promote, flip, retry and roll back rollouts, and
    read or clear a version's INT8 agreement on live traffic."""
    router = APIRouter(prefix="/api/v1")

    @router.post("/models/{name}/rollouts", status_code=201, responses=_DRY_RUN_RESPONSE)
    async def start(
        name: str, body: RolloutRequest, request: Request, response: Response, dry_run: bool = False
    ) -> dict[str, Any]:
        """Start a rollout; ``?dry_run=true``: only preview its cost (200, nothing written)."""
        if dry_run:
            response.status_code = 200
            return rollouts.preview(name, body)
        return rollouts.start(name, body, actor_of(request))

    @router.get("/rollouts")
    async def list_rollouts() -> list[dict[str, Any]]:
        return rollouts.all()

    @router.get("/models/{name}/rollout")
    async def current(name: str) -> dict[str, Any]:
        return rollouts.current(name)

    @router.post("/models/{name}/rollout/promote")
    async def promote(name: str, request: Request) -> dict[str, Any]:
        return rollouts.promote(name, actor_of(request))

    @router.post("/models/{name}/rollout/flip")
    async def flip(name: str, request: Request, body: FlipRequest | None = None) -> dict[str, Any]:
        """Switch a staged rollout's nodes together at ``at`` (or move the instant before it comes)."""
        at = body.at.timestamp() if body is not None and body.at is not None else None
        return rollouts.flip(name, at, actor_of(request))

    @router.post("/models/{name}/rollout/retry")
    async def retry(name: str, request: Request, body: RetryRequest | None = None) -> dict[str, Any]:
        """Count failed nodes again (all, or ``nodes``); their edges retry on a new desired state."""
        return rollouts.retry(name, body.nodes if body is not None else None, actor_of(request))

    @router.post("/models/{name}/rollback")
    async def rollback(name: str, request: Request) -> dict[str, Any]:
        return rollouts.rollback(name, actor_of(request))

    @router.get("/models/{name}/versions/{version}/agreement")
    async def agreement(name: str, version: str) -> dict[str, Any]:
        """Live agreement of the version's INT8 with FP32, per node and pooled, and the fallbacks."""
        return rollouts.agreement(name, version)

    @router.delete("/models/{name}/versions/{version}/agreement")
    async def clear_agreement(name: str, version: str) -> dict[str, Any]:
        """Forget the version's flags and fallbacks: its nodes serve their own choice again."""
        return rollouts.clear_agreement(name, version)

    return router
