"""Rollouts for the dashboard, read through central's own REST contract.

The rollout service is a separate part of central with its own API
(``GET /api/v1/rollouts``); asking the application in-process over ASGI keeps the
dashboard to that contract alone, and a central without the endpoint (404) simply
shows no rollouts. The call carries the page's own credential (its ``Authorization``
header or cookie): with ``auth.protect_reads`` the rollouts are a read like any other."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.types import ASGIApp

__all__ = ["RestRollouts"]

log = logging.getLogger(__name__)

ROLLOUTS_PATH = "/api/v1/rollouts"


class RestRollouts:
    """Calls ``GET /api/v1/rollouts`` on ``app`` in-process; None when it does not answer 200."""

    def __init__(self, app: ASGIApp, credentials: Mapping[str, str] | None = None) -> None:
        """``credentials``: the ``authorization`` / ``cookie`` headers of the page's request."""
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url="http://central",
            headers=dict(credentials or {}),
        )
        self._warned = False

    async def __call__(self) -> list[dict[str, Any]] | None:
        try:
            response = await self._client.get(ROLLOUTS_PATH)
        except httpx.HTTPError as exc:
            self._warn(f"{type(exc).__name__}: {exc}")
            return None
        if response.status_code != 200:
            return None  # 404: this central has no rollout API (yet)
        body = response.json()
        if not isinstance(body, list):
            self._warn(f"expected a list, got {type(body).__name__}")
            return None
        return [r for r in body if isinstance(r, dict)]

    def _warn(self, why: str) -> None:
        if not self._warned:  # once per stream: the page shows the empty state either way
            self._warned = True
            log.warning("dashboard: rollouts unavailable: %s", why)

    async def aclose(self) -> None:
        """Release the in-process client."""
        await self._client.aclose()
