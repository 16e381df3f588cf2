"""The gRPC half of central's error map: each ``CentralError`` names its status code
(``rpc_status``); this turns the name into grpc's enum and ends a call with it."""

from __future__ import annotations

import grpc

from central.errors import CentralError

#: Status details travel in a trailer (8 KiB limit by default); a message echoing a huge
#: client-sent id would turn the clear status into the client's RESOURCE_EXHAUSTED.
_MAX_DETAILS = 1000


def grpc_code_of(exc: CentralError) -> grpc.StatusCode:
    """The gRPC status code of ``exc``."""
    return grpc.StatusCode[exc.rpc_status]


async def abort(context: grpc.aio.ServicerContext, exc: CentralError) -> None:
    """End the call with ``exc``'s code and message (cut to what a trailer holds); raises."""
    message = exc.message if len(exc.message) <= _MAX_DETAILS else exc.message[:_MAX_DETAILS] + "…"
    await context.abort(grpc_code_of(exc), message)
