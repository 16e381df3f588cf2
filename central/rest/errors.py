"""How every REST error looks: ``{"error": "…"}`` with its status (``CentralError``'s, a
validation's 422, a store that is away's 503 with Retry-After), and the OpenAPI shape of it."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

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


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as ``{"error": "…"}`` with its status."""

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
