"""REST routes of edges' chunk byte-rate caps: read and replace the policy
(``central.distribution.transfer_policy``). A PUT is a write: with ``auth.enabled`` it
needs an admin token (``OperatorAuth``), and a body that does not validate gets a 422
with the field at fault."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from central.auth import actor_of
from central.distribution.transfer_policy import TransferPolicy
from central.events import operator_event
from central.settings import TransferSettings
from fleetwire.mqtt.payloads import Event


def create_transfer_router(policy: TransferPolicy, record_event: Callable[[Event], None]) -> APIRouter:
    """``GET/PUT /api/v1/transfer``: fleet, per-site and per-node caps (bytes/s; null: the
    edge's own setting, 0: no cap)."""
    router = APIRouter(prefix="/api/v1")

    @router.get("/transfer", response_model=TransferSettings)
    async def current() -> dict[str, Any]:
        return policy.settings.model_dump()

    @router.put("/transfer", response_model=TransferSettings)
    async def replace(body: TransferSettings, request: Request) -> dict[str, Any]:
        """Replace the whole policy; every connected edge gets its new caps in a desired state."""
        policy.replace(body)
        detail = body.model_dump(exclude_none=True)
        record_event(operator_event("transfer_caps_changed", actor_of(request), detail))
        return body.model_dump()

    return router
