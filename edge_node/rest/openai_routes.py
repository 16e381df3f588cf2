"""The OpenAI-compatible API of an edge: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``, streamed as server-sent events with ``stream: true``.

A thin transport over :class:`~edge_node.generation.service.LanguageModels`: it turns the
request into prompt token ids and sampling parameters, and steps into OpenAI's objects.
Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.

Extensions for central's gateway (which continues a stream on another node when this one
dies): ``"return_token_ids": true`` makes every streamed chunk carry ``token_ids`` (the
tokens generated since the previous chunk, whose text it completes), the first one also
``prompt_token_ids``, ``model_version`` and the request's effective ``max_tokens``;
``resume_offset`` (``textgen.sampling``) continues a completion whose first tokens end the
prompt."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from edge_node.errors import EdgeError
from edge_node.generation import StepOutput
from edge_node.generation.service import LanguageModel, LanguageModels
from edge_node.generation.tokenizer import ChatTemplateError
from edge_node.rest.textgen import FieldError, Started, get_typed, param_of, read_json, sampling, sse, start_stream
from fleetwire.openai_errors import OPENAI_ERRORS

__all__ = ["create_openai_routes", "openai_error"]

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}  # fmt: skip
_CODES = {404: "model_not_found", 429: "rate_limit_exceeded", 503: "overloaded"}
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def openai_error(exc: EdgeError) -> dict[str, Any]:
    """``exc`` in OpenAI's error shape."""
    status = exc.status
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": str(exc), "type": kind, "param": param_of(exc), "code": _CODES.get(status)}}


def error_response(exc: EdgeError) -> Response:
    """OpenAI's error shape with the error's status (and Retry-After when it has one)."""
    return Response(orjson.dumps(openai_error(exc)), exc.status, exc.retry_after_header, "application/json")


def completion_prompt(model: LanguageModel, doc: dict[str, Any]) -> list[int]:
    """``prompt``: a string, a list of one string, or a list of token ids."""
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return model.engine.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise FieldError("prompt must be a string, a list of one string, or a list of token ids", param="prompt")


def chat_messages(doc: dict[str, Any]) -> list[dict[str, str]]:
    """``messages`` as plain ``{"role", "content"}`` dicts (text content parts joined)."""
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages must be a non-empty list", param="messages")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            role = message.get("role") if isinstance(message, dict) else None
            raise FieldError(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}", param="messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise FieldError(f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is not None and not isinstance(content, str):
            raise FieldError(f"messages[{i}].content must be a string or a list of text parts", param="messages")
        plain.append({"role": message["role"], "content": content or ""})
    return plain


def chat_prompt(model: LanguageModel, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """``messages`` rendered by the model's chat template, then encoded."""
    tokenizer = model.engine.tokenizer
    return tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def warm_next_turn(model: LanguageModel, messages: list[dict[str, str]], reply: str) -> None:
    """Hand the engine the conversation as its next turn will begin — ``messages`` and the
    ``reply`` as the client got it, rendered as a past turn — to cache while it has nothing
    else to prefill (``EngineSettings.turn_warm_tokens``). A template that cannot render it
    (one that insists on alternating roles, say) just leaves the turn unwarmed."""
    try:
        model.engine.warm(chat_prompt(model, [*messages, {"role": "assistant", "content": reply}], False))
    except ChatTemplateError:
        return
    except Exception:  # an optional step: never the reason a finished answer fails to arrive
        log.exception("warming the next turn of a chat failed")


def usage(step: StepOutput) -> dict[str, Any]:
    """OpenAI's ``usage`` from the last step."""
    total = step.prompt_tokens + step.completion_tokens
    details = {"cached_tokens": step.cached_tokens}
    return {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens,
            "total_tokens": total, "prompt_tokens_details": details}  # fmt: skip


class _Call:
    """One request's identity and the shape of its objects (completion or chat)."""

    def __init__(self, model: LanguageModel, chat: bool, messages: list[dict[str, str]] | None = None) -> None:
        """``messages``: a chat's, whose next turn is warmed when it ends (None: nothing to warm)."""
        self.model, self.chat, self.messages = model, chat, messages
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def ended(self, text: str) -> None:
        """The completion ended with ``text`` (not failed, not cut off by the client)."""
        if self.messages is not None:
            warm_next_turn(self.model, self.messages, text)

    def wrap(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if self.chat and stream else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model.name, "choices": choices}

    def choice(self, text: str | None, finish: str | None, stream: bool, first: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        if not stream:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                    "logprobs": None}  # fmt: skip
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    async def chunks(
        self, started: Started, include_usage: bool, ids: _TokenIds | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks: text deltas, a last one with finish_reason, then usage. With
        ``ids`` (``return_token_ids``) each chunk carries the token ids it completes."""
        ids = ids or _TokenIds(None)
        if self.chat:
            yield ids.attach(self.wrap([self.choice("", None, True, first=True)], True))
        last: StepOutput | None = None
        parts: list[str] = []
        try:
            async for step in started.steps():
                last = step
                ids.add(step.token_ids)
                if step.text:
                    parts.append(step.text)
                    yield ids.attach(self.wrap([self.choice(step.text, None, True)], True))
        except EdgeError as exc:  # the engine stopped mid-stream (a version swap or shutdown)
            yield openai_error(exc)
            return
        if last is None:
            return
        self.ended("".join(parts))
        yield ids.attach(self.wrap([self.choice(None if self.chat else "", last.finish_reason, True)], True))
        if include_usage:
            yield {**self.wrap([], True), "usage": usage(last)}


class _TokenIds:
    """The token ids a chunk completes (``return_token_ids``), or nothing when not asked."""

    def __init__(self, first: dict[str, Any] | None) -> None:
        """``first``: what the first chunk carries besides (None: ids not asked for)."""
        self._on = first is not None
        self._first: dict[str, Any] = first or {}
        self._pending: list[int] = []

    def add(self, token_ids: tuple[int, ...]) -> None:
        if self._on:
            self._pending.extend(token_ids)

    def attach(self, chunk: dict[str, Any]) -> dict[str, Any]:
        if not self._on:
            return chunk
        chunk["token_ids"], self._pending = self._pending, []
        if self._first:
            chunk.update(self._first)
            self._first = {}
        return chunk


def create_openai_routes(service: LanguageModels) -> APIRouter:
    """The ``/v1`` routes over ``service``."""
    router = APIRouter(tags=["openai"])
    limit = service.plane.limits.max_body_bytes

    @router.get("/v1/models", responses=OPENAI_ERRORS)
    async def models() -> Response:
        data = [{"id": m.name, "object": "model", "created": m.created, "owned_by": "modelfleet"}
                for m in service.served()]  # fmt: skip
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    async def complete(request: Request, chat: bool) -> Response:
        try:
            doc = await read_json(request, limit)
            name = get_typed(doc, "model", str)
            if not name:
                raise FieldError("model is required", param="model")
            model = service.get(name)
            messages = chat_messages(doc) if chat else None
            prompt = chat_prompt(model, messages) if messages is not None else completion_prompt(model, doc)
            params = sampling(doc, len(prompt), model.engine.context_length)
            if params.resume_offset or not model.engine.warms:  # only the reply's tail, or warming off
                messages = None
            stream = bool(doc.get("stream"))
            options = get_typed(doc, "stream_options", dict, {})
            started = await start_stream(service, model, prompt, params)
        except EdgeError as exc:
            return error_response(exc)
        call = _Call(model, chat, messages)
        if stream:
            first = {"prompt_token_ids": prompt, "model_version": model.version, "max_tokens": params.max_tokens}
            ids = _TokenIds(first) if doc.get("return_token_ids") is True else None
            events = sse(call.chunks(started, bool(options.get("include_usage")), ids), done=True)
            return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(started.close),
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        return await _whole(call, started)

    async def _whole(call: _Call, started: Started) -> Response:
        parts: list[str] = []
        last = started.first
        try:
            async for step in started.steps():
                parts.append(step.text)
                last = step
        except EdgeError as exc:
            return error_response(exc)
        call.ended("".join(parts))
        body = call.wrap([call.choice("".join(parts), last.finish_reason, False)], False)
        return Response(orjson.dumps({**body, "usage": usage(last)}), media_type="application/json")

    @router.post("/v1/completions", responses=OPENAI_ERRORS)
    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    @router.post("/v1/chat/completions", responses=OPENAI_ERRORS)
    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    return router
