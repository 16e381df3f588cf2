"""The gateway's text APIs (``central.gateway.text_proxy`` does the routing and failover).

OpenAI-compatible: ``GET /v1/models`` (every language model a live node serves),
``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed as server-sent events
with ``stream: true``; OIP's generate extension: ``POST /v2/models/{m}/generate`` and
``/generate_stream``. Open like ``/v2`` (clients carry no operator token), under the same
limits: bodies over ``max_body_bytes`` get 413, beyond ``max_outstanding`` requests at once
(a stream holds its place until it ends) 503 with ``Retry-After``.

A conversation is pinned to one node by OpenAI's ``user`` field, or the ``X-Session-Id``
(or ``X-Modelfleet-Affinity-Key``) header. ``"return_token_ids": true`` adds the prompt's and
each chunk's token ids. Answers carry ``X-Modelfleet-Node``: the node that finished it, or
(a stream) the one it started on."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send

from central.gateway.prefix_index import block_hashes, prompt_bytes
from central.gateway.proxy import AFFINITY_HEADER, NODE_HEADER, GatewayProxy, GatewayResponse
from central.gateway.text_proxy import StreamBroken, TextCall, TextGateway, TextRefused
from central.gateway.text_shapes import Api, Piece, Shaper
from central.rest.gateway_routes import read_limited_body
from fleetwire.names import InvalidName, check_name
from fleetwire.openai_errors import OPENAI_ERRORS

__all__ = ["SESSION_HEADER", "create_text_router"]

#: Request header pinning a conversation to one node (as OpenAI's ``user`` field does).
SESSION_HEADER = "X-Session-Id"
_SSE_DONE = b"data: [DONE]\n\n"


class _ClosingStream(StreamingResponse):
    """A streaming response that closes its iterator however it ends (a client gone
    included), so the edge's stream is closed at once, not when the generator is collected."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _answer(answer: GatewayResponse) -> Response:
    return Response(content=answer.body, status_code=answer.status, headers=answer.headers)


def _session(doc: dict[str, Any], request: Request) -> str | None:
    user = doc.get("user")
    if isinstance(user, str) and user:
        return user
    return request.headers.get(SESSION_HEADER) or request.headers.get(AFFINITY_HEADER) or None


def create_text_router(proxy: GatewayProxy, text: TextGateway) -> APIRouter:
    """The text routes over ``text`` (and ``proxy``'s limits)."""
    router = APIRouter(tags=["text"])

    def refuse(api: Api, status: int, message: str) -> Response:
        return JSONResponse(Shaper(api, "", include_usage=False, with_ids=False).error(status, message), status)

    async def handle(request: Request, api: Api, name: str | None = None, stream: bool | None = None) -> Response:
        if (refusal := proxy.refusal()) is not None:  # a full gateway reads no body
            return _answer(refusal)
        body = await read_limited_body(request, proxy.max_body_bytes)
        if body is None:
            proxy.stats.too_large += 1
            return refuse(api, 413, f"request body exceeds the limit of {proxy.max_body_bytes} bytes")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return refuse(api, 400, f"the body is not valid UTF-8 JSON: {exc}")
        if not isinstance(doc, dict):
            return refuse(api, 400, "the body must be a JSON object")
        model = name if name is not None else doc.get("model")
        if not isinstance(model, str) or not model:
            return refuse(api, 400, "model is required")
        try:
            check_name("model name", model)
        except InvalidName as exc:
            return refuse(api, 422, str(exc))
        streaming = bool(doc.get("stream")) if stream is None else stream
        options = doc.get("stream_options")
        options = options if isinstance(options, dict) else {}
        shaper = Shaper(api, model, include_usage=bool(options.get("include_usage")),
                        with_ids=doc.get("return_token_ids") is True)  # fmt: skip
        prompt = {"prompt": doc.get("text_input")} if api == "generate" else doc
        call = TextCall(api, model, doc, block_hashes(prompt_bytes(prompt, api == "chat")), _session(doc, request),
                        shaper)  # fmt: skip
        places = contextlib.ExitStack()
        if (refusal := places.enter_context(proxy.holding())) is not None:
            return _answer(refusal)
        started = time.perf_counter()
        pieces = text.pieces(call)
        try:
            first = await anext(pieces)
        except TextRefused as exc:
            places.close()
            return _answer(exc.answer)
        except BaseException:
            places.close()
            raise
        if streaming:
            events = _events(call, first, pieces, places, proxy, started)
            headers = {"Cache-Control": "no-cache", NODE_HEADER: call.progress.nodes[0]}  # where it started
            return _ClosingStream(events, media_type="text/event-stream", headers=headers)
        with places:
            return await _whole(call, first, pieces, proxy, started)

    @router.get("/v1/models", responses=OPENAI_ERRORS)
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": await text.language_models()})

    @router.post("/v1/completions", responses=OPENAI_ERRORS)
    async def completions(request: Request) -> Response:
        return await handle(request, "completions")

    @router.post("/v1/chat/completions", responses=OPENAI_ERRORS)
    async def chat_completions(request: Request) -> Response:
        return await handle(request, "chat")

    @router.post("/v2/models/{name}/generate")
    async def generate(name: str, request: Request) -> Response:
        return await handle(request, "generate", name, stream=False)

    @router.post("/v2/models/{name}/generate_stream")
    async def generate_stream(name: str, request: Request) -> Response:
        return await handle(request, "generate", name, stream=True)

    return router


def _record(proxy: GatewayProxy, call: TextCall, status: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    proxy.rolling.record(elapsed, ok=status < 500)
    if proxy.observer is not None:
        proxy.observer(call.model, status, elapsed)


async def _whole(
    call: TextCall, first: Piece, pieces: AsyncIterator[Piece], proxy: GatewayProxy, started: float
) -> Response:
    """A request that did not ask for a stream: every piece, then one answer."""
    parts = [first.text]
    try:
        async for piece in pieces:
            parts.append(piece.text)
    except StreamBroken as exc:
        _record(proxy, call, 502, started)
        return JSONResponse(call.shaper.error(502, f"the generation broke and no node could continue it: {exc}"), 502)
    progress = call.progress
    call.shaper.version = progress.version
    doc = call.shaper.whole("".join(parts), progress.finish_reason, progress.usage_now(), progress.sent,
                            progress.prompt_ids)  # fmt: skip
    _record(proxy, call, 200, started)
    headers = {NODE_HEADER: progress.nodes[-1]} if progress.nodes else {}
    return Response(orjson.dumps(doc), media_type="application/json", headers=headers)


async def _events(
    call: TextCall,
    first: Piece,
    pieces: AsyncIterator[Piece],
    places: contextlib.ExitStack,
    proxy: GatewayProxy,
    started: float,
) -> AsyncIterator[bytes]:
    """The client's SSE stream: one or two events per piece, as the client takes them."""
    shaper, progress = call.shaper, call.progress
    status = 200
    try:
        piece: Piece | None = first
        while piece is not None:
            shaper.version = progress.version
            for doc in shaper.chunks(piece, progress.prompt_ids):
                yield _event(doc)
            piece = await anext(pieces, None)
        usage = shaper.usage_chunk(progress.usage_now())
        if usage is not None:
            yield _event(usage)
        if call.api != "generate":
            yield _SSE_DONE
    except StreamBroken as exc:
        status = 502
        yield _event(shaper.error(502, f"the stream broke and no node could continue it: {exc}"))
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
        places.close()
        _record(proxy, call, status, started)
