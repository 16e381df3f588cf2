"""REST routes of staged rollouts (contract: the rollout section of the operator API).
Thin: each route calls ``RolloutService`` and returns the rollout's public JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict

from central.auth import actor_of
from central.registry.service import check_name
from central.rollout import RolloutRequest, RolloutService

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


def create_rollout_router(rollouts: RolloutService) -> APIRouter:
    """``/api/v1`` routes that start, show, promote and roll back rollouts."""
    router = APIRouter(prefix="/api/v1")

    @router.post("/models/{name}/rollouts", status_code=201, responses=_DRY_RUN_RESPONSE)
    async def start(
        name: str, body: RolloutRequest, request: Request, response: Response, dry_run: bool = False
    ) -> dict[str, Any]:
        """Start a rollout; ``?dry_run=true``: only preview its cost (200, nothing written)."""
        check_name("model name", name)
        check_name("version", body.version)
        if dry_run:
            response.status_code = 200
            return rollouts.preview(name, body).as_dict()
        return rollouts.start(name, body, actor_of(request)).public()

    @router.get("/rollouts")
    async def list_rollouts() -> list[dict[str, Any]]:
        return [r.public() for r in rollouts.all()]

    @router.get("/models/{name}/rollout")
    async def current(name: str) -> dict[str, Any]:
        check_name("model name", name)
        return rollouts.get(name).public()

    @router.post("/models/{name}/rollout/promote")
    async def promote(name: str, request: Request) -> dict[str, Any]:
        check_name("model name", name)
        return rollouts.promote(name, actor_of(request)).public()

    @router.post("/models/{name}/rollout/flip")
    async def flip(name: str, request: Request, body: FlipRequest | None = None) -> dict[str, Any]:
        """Switch a staged rollout's nodes together at ``at`` (or move the instant before it comes)."""
        check_name("model name", name)
        at = body.at.timestamp() if body is not None and body.at is not None else None
        return rollouts.flip(name, at, actor_of(request)).public()

    @router.post("/models/{name}/rollout/retry")
    async def retry(name: str, request: Request, body: RetryRequest | None = None) -> dict[str, Any]:
        """Count failed nodes again (all, or ``nodes``); their edges retry on a new desired state."""
        check_name("model name", name)
        return rollouts.retry(name, body.nodes if body is not None else None, actor_of(request)).public()

    @router.post("/models/{name}/rollback")
    async def rollback(name: str, request: Request) -> dict[str, Any]:
        check_name("model name", name)
        return rollouts.rollback(name, actor=actor_of(request)).public()

    return router
