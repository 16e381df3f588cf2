"""What the text APIs (OpenAI-compatible, OIP generate) share: reading a JSON body, turning
request fields into :class:`SamplingParams`, starting a stream so its errors come before the
status line, and server-sent events. Each field error is an :class:`InvalidRequest` (400)
whose ``param`` names the field."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request

from edge_node.errors import EdgeError, InvalidRequest
from edge_node.generation import BadSampling, SamplingParams, StepOutput
from edge_node.generation.service import LanguageModel, LanguageModels
from edge_node.rest.body import read_body

__all__ = ["FieldError", "Started", "read_json", "sampling", "sse", "start_stream"]

#: Largest max_tokens when a request gives none: the room left in the context, capped here.
DEFAULT_MAX_TOKENS = 256
#: ``data: [DONE]``, the end of an OpenAI stream.
SSE_DONE = b"data: [DONE]\n\n"


class FieldError(InvalidRequest):
    """A request field that is missing or wrong (400); ``param`` names it."""

    def __init__(self, message: str, *, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def param_of(exc: EdgeError) -> str | None:
    """The request field an error is about, if it says."""
    if isinstance(exc, FieldError):
        return exc.param
    if isinstance(exc, BadSampling):
        return exc.field
    return None


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (400 for anything else, non-UTF-8 included)."""
    body = await read_body(request, limit)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise FieldError(f"the body is not valid UTF-8 JSON: {exc}", param=None) from None
    if not isinstance(doc, dict):
        raise FieldError("the body must be a JSON object", param=None)
    return doc


def get_typed(doc: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
    """``doc[name]`` if of ``kinds`` (booleans are not numbers), ``default`` if absent or null."""
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise FieldError(f"{name} must not be a boolean", param=name)
    if not isinstance(value, kinds):
        raise FieldError(f"{name} has the wrong type ({type(value).__name__})", param=name)
    return value


def sampling(doc: Mapping[str, Any], prompt_tokens: int, context: int) -> SamplingParams:
    """SamplingParams from OpenAI-style fields (``max_tokens`` / ``max_completion_tokens``,
    ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``repetition_penalty``);
    ``n`` other than 1 and non-zero presence/frequency penalties are refused by name.
    Extension ``resume_offset`` (central's gateway resuming a stream another node began): the
    last that many prompt tokens are the completion so far (see ``SamplingParams``)."""
    n = get_typed(doc, "n", int, 1)
    if n != 1:
        raise FieldError("only n=1 is supported: send one request per completion", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if get_typed(doc, name, (int, float), 0) != 0:
            raise FieldError(f"{name} is not supported; use repetition_penalty (> 0, 1 is off)", param=name)
    if doc.get("logprobs") or doc.get("echo") or doc.get("best_of", 1) not in (1, None):
        raise FieldError("logprobs, echo and best_of are not supported", param="logprobs")
    room = max(1, min(DEFAULT_MAX_TOKENS, context - prompt_tokens))
    max_tokens = get_typed(doc, "max_completion_tokens", int, None)
    max_tokens = get_typed(doc, "max_tokens", int, room) if max_tokens is None else max_tokens
    stop = get_typed(doc, "stop", (str, list), ())
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise FieldError("stop must be a string or a list of strings", param="stop")
    resume_offset = get_typed(doc, "resume_offset", int, 0)
    if resume_offset < 0 or (resume_offset and resume_offset >= prompt_tokens):
        raise FieldError("resume_offset must be ≥ 0 and below the prompt's token count", param="resume_offset")
    return SamplingParams(
        max_tokens=max_tokens,
        resume_offset=resume_offset,
        temperature=get_typed(doc, "temperature", (int, float), 1.0),
        top_p=get_typed(doc, "top_p", (int, float), 1.0),
        top_k=max(0, get_typed(doc, "top_k", int, 0)),
        seed=get_typed(doc, "seed", int, None),
        repetition_penalty=get_typed(doc, "repetition_penalty", (int, float), 1.0),
        stop=tuple(stop) if isinstance(stop, list) else (stop,) if stop else (),
        ignore_eos=bool(get_typed(doc, "ignore_eos", bool, False)),
    )


@dataclass
class Started:
    """A stream whose first step arrived: the step, the rest, and what to release at the end."""

    first: StepOutput
    rest: AsyncGenerator[StepOutput]
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _closed: bool = False

    async def steps(self) -> AsyncIterator[StepOutput]:
        """Every step, the first included; the stream is closed (its slot freed) at the end."""
        try:
            yield self.first
            if self.first.finish_reason is None:
                async for step in self.rest:
                    yield step
        finally:
            await self.close()

    async def close(self) -> None:
        """Cancel the sequence if still running and give back the in-flight place (idempotent)."""
        if not self._closed:
            self._closed = True
            try:
                await self.rest.aclose()
            finally:
                self._exit.close()


async def start_stream(
    service: LanguageModels, model: LanguageModel, prompt: list[int], params: SamplingParams
) -> Started:
    """Admit the request (the plane's in-flight cap) and wait for its first step, so that
    every refusal (400, 429, 503) is raised here, before anything is sent."""
    exit_stack = contextlib.ExitStack()
    exit_stack.enter_context(service.admitted(model.name))
    steps = service.stream(model, prompt, params)
    try:
        first = await anext(steps)
    except BaseException:
        await steps.aclose()
        exit_stack.close()
        raise
    return Started(first, steps, exit_stack)


async def sse(events: AsyncIterator[Any], done: bool) -> AsyncIterator[bytes]:
    """Server-sent events: ``data: {json}`` per event, then ``data: [DONE]`` if ``done``."""
    async for event in events:
        yield b"data: " + orjson.dumps(event) + b"\n\n"
    if done:
        yield SSE_DONE


def error_event(exc: EdgeError, shape: Callable[[EdgeError], dict[str, Any]]) -> bytes:
    """An error that came after the stream started, as one last event."""
    return b"data: " + orjson.dumps(shape(exc)) + b"\n\n"
