"""How an OIP error travels over KServe v2 gRPC: one map from the HTTP status that the REST
transports answer to the gRPC status code, so an edge and central's gateway refuse a request
with the same code whichever transport carried it. An overload's ``Retry-After`` seconds go
in the trailing metadata key ``retry-after``, as the REST answer's header carries them."""

from __future__ import annotations

from typing import NoReturn

import grpc

__all__ = ["MAX_DETAILS", "RETRY_AFTER", "abort", "grpc_code"]

#: Trailing metadata key holding the seconds to wait before a retry (an overload, 503).
RETRY_AFTER = "retry-after"
#: Status details travel in a trailer (8 KiB by default); a longer message (one that echoes a
#: client's huge name) would turn the clear status into the client's RESOURCE_EXHAUSTED.
MAX_DETAILS = 1000

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,  # a request the model refuses (dtype, shape, values)
    404: grpc.StatusCode.NOT_FOUND,  # no such model (version) here
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # over a size limit (limits.max_tensor_elements…)
    422: grpc.StatusCode.INVALID_ARGUMENT,  # a name no model can have
    500: grpc.StatusCode.INTERNAL,  # the server failed a request it accepted
    502: grpc.StatusCode.UNAVAILABLE,  # the gateway lost the node's connection twice
    503: grpc.StatusCode.UNAVAILABLE,  # not loaded, overloaded, no node can serve: retry
    504: grpc.StatusCode.DEADLINE_EXCEEDED,  # the gateway's node did not answer in time
}


def grpc_code(http_status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP error status (other 4xx: INVALID_ARGUMENT; other 5xx: INTERNAL)."""
    if http_status in _CODES:
        return _CODES[http_status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= http_status < 500 else grpc.StatusCode.INTERNAL


async def abort(
    context: grpc.aio.ServicerContext, http_status: int, message: str, retry_after: str | None = None
) -> NoReturn:
    """End the call with the code of ``http_status`` and ``message`` (cut to MAX_DETAILS), and
    ``retry-after`` in the trailing metadata when given."""
    if len(message) > MAX_DETAILS:
        message = message[:MAX_DETAILS] + "…"
    trailing = ((RETRY_AFTER, retry_after),) if retry_after is not None else ()
    await context.abort(grpc_code(http_status), message, trailing_metadata=trailing)
    raise AssertionError("not reached: abort raises")  # for type checkers
