"""A raw ASGI fast path for inference in front of the edge's FastAPI app.

FastAPI's routing, middleware and dependency machinery cost more of the event loop than
decoding, batching and encoding a small inference request together (37–55 % of the loop
thread in a profile of the serving bench), and the loop thread is what bounds an edge's
request rate. So ``POST /v2/models/{name}/infer`` and ``…/versions/{v}/infer`` are matched
here by splitting the path and answered straight over ASGI, with the very transport code
the FastAPI routes run (:func:`edge_node.rest.infer.infer_reply`): the same body cap,
headers, statuses, ``Retry-After`` and OIP error shape. Every other request, and any path
this matcher does not take (a trailing slash, another method), goes to FastAPI, which still
declares the inference routes for the OpenAPI document.

The bench ceiling (``POST /bench/noop``, with ``bench_endpoints``) is served here too, so
the serving benchmark compares inference with a no-op over the same stack.

The edge's HTTP side has no authentication middleware (TLS and client certificates are
uvicorn's, below every ASGI app), so the fast path skips no check FastAPI would make."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from edge_node.errors import BodyTooLarge
from edge_node.inference.dataplane import DataPlane
from edge_node.rest.body import receive_body
from edge_node.rest.infer import InferReply, error_reply, infer_reply

NOOP_PATH = "/bench/noop"
_NOOP_BODY = b'{"outputs":[]}'
_JSON = b"application/json"


def _infer_target(path: str) -> tuple[str, str | None] | None:
    """``(name, version)`` when ``path`` is an inference path, else None. A segment is
    non-empty and slash-free, as a Starlette ``{param}`` is."""
    parts = path.split("/")
    if len(parts) < 5 or parts[-1] != "infer" or parts[1] != "v2" or parts[2] != "models" or not parts[3]:
        return None
    if len(parts) == 5:  # "", "v2", "models", name, "infer"
        return parts[3], None
    if len(parts) == 7 and parts[4] == "versions" and parts[5]:  # …, name, "versions", v, "infer"
        return parts[3], parts[5]
    return None


def _headers(scope: Scope) -> tuple[str | None, str | None]:
    """The request's Content-Length and Inference-Header-Content-Length (first of each, as
    Starlette's ``headers.get`` gives)."""
    length = header_length = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            if length is None:
                length = value.decode("latin-1")
        elif key == b"inference-header-content-length" and header_length is None:
            header_length = value.decode("latin-1")
    return length, header_length


async def _send(send: Send, status: int, body: bytes, content_type: bytes, extra: dict[str, str] | None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class InferFastPath:
    """The ASGI app an edge serves: inference (and the bench no-op) here, the rest in ``app``."""

    def __init__(self, app: FastAPI, plane: DataPlane, *, bench_endpoints: bool = False) -> None:
        self.fastapi = app
        """The FastAPI app behind the fast path (routes, OpenAPI document)."""
        self.plane = plane
        self.bench_endpoints = bench_endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            target = _infer_target(path)
            if target is not None:
                await self._infer(scope, receive, send, *target)
                return
            if path == NOOP_PATH and self.bench_endpoints:
                await self._noop(scope, receive, send)
                return
        await self.fastapi(scope, receive, send)

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str, version: str | None) -> None:
        length, header_length = _headers(scope)
        try:
            reply: InferReply = await infer_reply(
                self.plane, name, version, lambda limit: receive_body(receive, length, limit), header_length
            )
        except ClientDisconnect:
            return  # nobody to answer
        await _send(send, reply.status, reply.body, reply.content_type.encode(), reply.headers)

    async def _noop(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Reads the body like inference does (same reader, same cap) and answers a fixed
        small document: the ceiling of this HTTP stack, for the serving benchmark."""
        length, _ = _headers(scope)
        try:
            await receive_body(receive, length, self.plane.limits.max_body_bytes)
        except ClientDisconnect:
            return
        except BodyTooLarge as exc:  # over the cap: answered as inference would be
            reply = error_reply(exc)
            await _send(send, reply.status, reply.body, _JSON, None)
            return
        await _send(send, 200, _NOOP_BODY, _JSON, None)
