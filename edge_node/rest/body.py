"""Reading an inference request body under a size cap. The cap is enforced twice: a
declared Content-Length over it is refused before a byte is read, and a chunked body
(no length) is refused as soon as what arrived passes it, so no client can make the
edge buffer more than the cap. Two readers share these rules: one over a Starlette
request (the FastAPI routes), one over raw ASGI ``receive`` (the inference fast path)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect

from edge_node.errors import BodyTooLarge

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import Receive


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body exceeds the limit of {limit} bytes (limits.max_infer_body_bytes)")


def check_declared_length(declared: str | None, limit: int) -> None:
    """BodyTooLarge when the request's Content-Length already says it is over ``limit``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed ``limit``."""
    check_declared_length(request.headers.get("content-length"), limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """:func:`read_body` over raw ASGI: ``declared`` is the Content-Length header (or None).
    Raises Starlette's ClientDisconnect when the client leaves before the body ended, as
    ``request.stream()`` does, so both transports treat a departure alike."""
    check_declared_length(declared, limit)
    message = await receive()
    if message["type"] != "http.request":
        raise ClientDisconnect()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the common case: the whole body in one message
        if len(body) > limit:
            raise _too_large(limit)
        return body
    parts, size = [body], len(body)
    while True:
        if size > limit:
            raise _too_large(limit)
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        parts.append(chunk)
        if not message.get("more_body", False):
            if size > limit:
                raise _too_large(limit)
            return b"".join(parts)
