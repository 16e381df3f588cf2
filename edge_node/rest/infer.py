"""The REST inference transport in one function, :func:`infer_reply`, shared by the FastAPI
routes and the raw ASGI fast path so the two cannot drift: the same body cap, headers,
statuses, ``Retry-After`` and OIP error shape whichever of them matched the request."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from starlette.requests import ClientDisconnect

from edge_node.errors import EdgeError, InvalidRequest
from edge_node.inference.dataplane import DataPlane
from edge_node.inference.repository import LoadedModel
from edge_node.inference.request import InferRequest
from edge_node.rest.codec import decode_request, encode_response

__all__ = ["BodyReader", "InferReply", "infer_reply"]

log = logging.getLogger(__name__)

#: Reads the request body under a cap (its argument, in bytes); see ``edge_node.rest.body``.
BodyReader = Callable[[int], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class InferReply:
    """One inference answer, whatever writes it: status, body, content type and the extra
    headers (``Inference-Header-Content-Length``, ``Retry-After``)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] | None = None


def error_reply(exc: EdgeError) -> InferReply:
    """The OIP error shape with the error's status (and ``Retry-After`` on an overload)."""
    return InferReply(exc.status, orjson.dumps({"error": str(exc)}), headers=exc.retry_after_header)


def _header_length(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.strip().isdigit()):  # "²".isdigit() is True, int("²") raises
        raise InvalidRequest(f"Inference-Header-Content-Length must be a non-negative integer, got {raw!r}")
    return int(raw)


async def _run_infer(
    plane: DataPlane, name: str, version: str | None, read: BodyReader, header_length: str | None
) -> InferReply:
    plane.check_admission(name, version)  # a full edge reads no body
    # The body before the place, and before the lookup (no version swap between lookup
    # and run): a client sending it slowly holds no place, only its socket.
    body = await read(plane.limits.max_body_bytes)
    length_in = _header_length(header_length)
    with plane.admitted(name, version):
        decoded: list[InferRequest] = []

        def decode(_: LoadedModel) -> InferRequest:
            decoded.append(decode_request(body, length_in, plane.limits.max_tensor_elements))
            return decoded[0]

        result = await plane.infer(name, version, decode)
    payload, length = encode_response(result.model.name, result.model.version, decoded[0], result.outputs)
    if length is None:
        return InferReply(200, payload)
    return InferReply(200, payload, "application/octet-stream", {"Inference-Header-Content-Length": str(length)})


async def infer_reply(
    plane: DataPlane, name: str, version: str | None, read: BodyReader, header_length: str | None
) -> InferReply:
    """Admit, read the body with ``read(limit)``, decode it (``header_length``: the raw
    Inference-Header-Content-Length header), run it on ``plane`` and encode the answer; every
    failure becomes the OIP error shape with its status. A client that left (Starlette's
    ClientDisconnect) is re-raised: nobody is there to answer."""
    try:
        return await _run_infer(plane, name, version, read, header_length)
    except EdgeError as exc:
        return error_reply(exc)
    except ClientDisconnect:
        raise
    except Exception as exc:  # a bug here must still answer in the OIP error shape
        log.exception("inference request for %s failed", name)
        return InferReply(500, orjson.dumps({"error": f"the edge failed on this request: {type(exc).__name__}: {exc}"}))
