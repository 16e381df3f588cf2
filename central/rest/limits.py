"""A cap on the JSON bodies of central's REST API (rollouts and any later ``/api/v1``
write). FastAPI reads a body whole before validating it, so without a cap one client
could make central buffer any amount; model uploads are exempt (they stream to disk
under ``max_upload_bytes``), and the gateway's ``/v2`` routes keep their own cap. And a
cap on the model pushes in progress at once (``UploadLimit``)."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from central.errors import Overloaded

#: Seconds a refused push is told to wait: a push of a large model takes seconds to minutes.
UPLOAD_RETRY_AFTER_S = 5
#: Default cap on one REST JSON body (central's ``max_json_body_bytes``).
DEFAULT_MAX_JSON_BODY_BYTES = 1024 * 1024
_API = "/api/v1/"


def is_upload(method: str, path: str) -> bool:
    """Whether this is a model push (``POST /api/v1/models/{name}/versions``), whose body
    streams to staging under its own limit."""
    return method == "POST" and path.startswith(f"{_API}models/") and path.endswith("/versions")


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class JsonBodyLimit:
    """ASGI middleware: a body over ``max_bytes`` on an ``/api/v1`` route is a 413
    ``{"error": …}``: at once when Content-Length says so, else as soon as the bytes
    received pass it (a chunked body), before the route has buffered more."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_JSON_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"request body exceeds the limit of {self.max_bytes} bytes (max_json_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(_API) or is_upload(scope["method"], path):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await JSONResponse({"error": self._message()}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def capped() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Re-raised by FastAPI's body parsing; the app's handler answers {"error": …}.
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, capped, send)


class UploadLimit:
    """ASGI middleware: at most ``limit`` model pushes in progress (received, staged and
    committed): each may stage up to ``max_upload_bytes`` on disk, so without a cap
    concurrent pushes could fill central's disk. A push beyond them is a 503
    ``{"error": …}`` with ``Retry-After``, before a byte of its body is read; otherwise it
    holds a slot until its response has ended (or the client went away). One event loop:
    no locking."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        if limit < 1:
            raise ValueError("the upload limit must be at least 1")
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_upload(scope["method"], scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            exc = Overloaded(
                f"{self.active} model pushes are in progress (max_concurrent_uploads={self.limit});"
                f" retry in {UPLOAD_RETRY_AFTER_S}s",
                retry_after_s=UPLOAD_RETRY_AFTER_S,
            )
            answer = JSONResponse({"error": exc.message}, status_code=exc.http_status, headers=exc.http_headers)
            await answer(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
