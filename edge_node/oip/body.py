"""Reading an inference request body under a size cap. The cap is enforced twice: a
declared Content-Length over it is refused before a byte is read, and a chunked body
(no length) is refused as soon as what arrived passes it, so no client can make the
edge buffer more than the cap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_node.oip.codec import OipError

if TYPE_CHECKING:  # the DataPlane imports this module's cap; FastAPI loads later (edge_node.server)
    from fastapi import Request

#: Default cap on one inference request body (the edge's ``limits.max_infer_body_bytes``).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class BodyTooLarge(OipError):
    """The request body exceeds the configured cap: answered 413."""

    status = 413


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body exceeds the limit of {limit} bytes (limits.max_infer_body_bytes)")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
    return b"".join(parts)
