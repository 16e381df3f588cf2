"""The dashboard's HTTP surface.

- ``GET /dashboard``: the page (plain HTML, CSS and JS shipped in the package; no build
  step, nothing fetched from the network);
- ``GET /dashboard/{app.js,style.css}``: its assets;
- ``GET /api/v1/dashboard``: one snapshot as JSON;
- ``GET /api/v1/stream``: Server-Sent Events, ``snapshot`` on connect and every second,
  ``membership`` on every node state change, and a last ``revoked`` when the stream's token
  is revoked (see ``central.dashboard.service``).

The transport knows who asked; ``guard`` (central's REST app, with ``auth.protect_reads``)
turns a request into the check its stream repeats and the name it logs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse

from central.dashboard.rollouts import RestRollouts
from central.dashboard.service import DashboardService, StillAllowed
from central.errors import NotFound

__all__ = ["STATIC_DIR", "StreamGuard", "create_dashboard_router"]

#: A request's stream check and the credential's name, or None when nothing is to re-check.
StreamGuard = Callable[[Request], tuple[StillAllowed, str] | None]

STATIC_DIR = Path(__file__).parent / "static"
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page must follow central's upgrades at once, and a stream must not be buffered.
_NO_CACHE = {"Cache-Control": "no-cache"}
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _asset(name: str) -> Response:
    if name not in _ASSETS:
        raise NotFound(f"no dashboard file {name!r}")
    return FileResponse(STATIC_DIR / name, media_type=_ASSETS[name], headers=_NO_CACHE)


def create_dashboard_router(service: DashboardService, guard: StreamGuard | None = None) -> APIRouter:
    """The dashboard's routes over ``service``; ``guard`` re-checks a stream's credential."""
    router = APIRouter()

    @router.get("/dashboard", include_in_schema=False)
    async def page() -> Response:
        return _asset("index.html")

    @router.get("/dashboard/", include_in_schema=False)
    async def page_slash() -> Response:
        return RedirectResponse("/dashboard")

    @router.get("/dashboard/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return _asset(name)

    @router.get("/api/v1/dashboard")
    async def snapshot(request: Request) -> dict[str, Any]:
        rollouts = RestRollouts(request.app, _credentials(request))
        try:
            return await service.snapshot(rollouts)
        finally:
            await rollouts.aclose()

    @router.get("/api/v1/stream")
    async def stream(request: Request) -> StreamingResponse:
        checked = guard(request) if guard is not None else None
        allowed, who = checked if checked is not None else (None, "anonymous")
        body = _stream(service, RestRollouts(request.app, _credentials(request)), allowed, who)
        return StreamingResponse(body, media_type="text/event-stream", headers=_STREAM_HEADERS)

    return router


def _credentials(request: Request) -> dict[str, str]:
    """The headers that prove who asked (forwarded to the in-process rollouts read)."""
    return {k: v for k, v in request.headers.items() if k in ("authorization", "cookie")}


async def _stream(
    service: DashboardService, rollouts: RestRollouts, allowed: StillAllowed | None, who: str
) -> AsyncIterator[bytes]:
    try:
        async for chunk in service.stream(rollouts, allowed, who):
            yield chunk
    finally:
        await rollouts.aclose()
