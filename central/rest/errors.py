"""How every REST error looks: ``{"error": "…"}`` with its status (``CentralError``'s, a
validation's 422, a store that is away's 503 with Retry-After), and the OpenAPI shape of it."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from central.errors import CentralError, StoreUnavailable, unavailable_store_errors

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """The one error shape of every route: ``{"error": "…"}``."""

    error: str


#: Declared on every route so that the OpenAPI document says what an error looks like
#: (and replaces FastAPI's default 422 shape, which the handlers below never send).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 404, 405, 409, 413, 422)
}


#: Seconds between two "client went away" lines: one client cutting requests in a loop
#: must not be able to fill central's log (it used to cost two tracebacks a request).
GONE_LOG_INTERVAL_S = 10.0


class DepartureLog:
    """One short line, at most every ``interval_s``, for clients that left mid-request
    (Starlette's ``ClientDisconnect``), counting the ones in between."""

    def __init__(self, interval_s: float = GONE_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.departures = 0
        """Requests whose client went away before they were answered, since start."""
        self._unlogged = 0
        self._next_line = 0.0

    def record(self, method: str, path: str) -> None:
        """Count one departure; log it when the last line is ``interval_s`` old."""
        self.departures += 1
        self._unlogged += 1
        now = time.monotonic()
        if now < self._next_line:
            return
        log.info(
            "a client went away before its request was answered (%s %s); %d such request(s) since the last line",
            method,
            path[:100],
            self._unlogged,
        )
        self._unlogged = 0
        self._next_line = now + self.interval_s


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as ``{"error": "…"}`` with its status; a client that went away
    is one rate-limited short line (``DepartureLog``), never a traceback."""

    departures = DepartureLog()

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        departures.record(request.method, request.url.path)
        return JSONResponse({"error": "the client went away"}, status_code=400)  # nobody reads it

    @app.exception_handler(CentralError)
    async def central_error(_: Request, exc: CentralError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.http_status, headers=exc.http_headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    store_away = unavailable_store_errors()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, store_away):  # PostgreSQL or S3 restarting: nothing was written
            log.warning("store unavailable: %s", exc)
            away = StoreUnavailable(f"the store is unavailable ({type(exc).__name__}); retry shortly")
            return JSONResponse({"error": away.message}, status_code=503, headers=away.http_headers)
        log.exception("unexpected error")
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)
