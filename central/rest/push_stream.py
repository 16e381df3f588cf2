"""``POST …/versions?progress=ndjson``: a push that reports its steps as they happen.

A push runs every step inside one request, so an operator watching a large model
quantize would otherwise see nothing for minutes. With this opt-in the response is
200 ``application/x-ndjson``, one JSON object per line:

- ``{"event": "step", "step": "validate", "phase": "start"}`` and ``…"phase": "end"``
  for every pipeline step (validate, quantize, guard, chunk, manifest), then
  ``place`` (chunks given owners on the ring) after the commit;
- last, ``{"event": "result", "manifest": …, "report": …, "placement": …}`` or
  ``{"event": "error", "status": 422, "error": "…"}``.

Errors found before the body is read (bad name, version taken, too large) are still
plain 4xx responses, as without the opt-in."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from central.errors import CentralError
from central.handlers import RegistryHandlers
from central.registry.pipeline import push_progress

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
#: Pushes whose client went away keep running to their end (a push is atomic either way).
_running: set[asyncio.Task[dict[str, Any]]] = set()
_DONE: dict[str, Any] = {}


def _line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _step(step: str, phase: str) -> dict[str, Any]:
    return {"event": "step", "step": step, "phase": phase}


async def _events(commit: Callable[[], Awaitable[dict[str, Any]]], registry: RegistryHandlers) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def listener(step: str, phase: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, _step(step, phase))

    async def run() -> dict[str, Any]:
        push_progress.set(listener)  # this task's context; the pipeline's thread inherits it
        try:
            return await commit()
        finally:
            queue.put_nowait(_DONE)

    generation = registry.generation
    task = loop.create_task(run())
    _running.add(task)
    task.add_done_callback(_running.discard)
    while (item := await queue.get()) is not _DONE:
        yield _line(item)
    try:
        result = task.result()
    except CentralError as exc:
        yield _line({"event": "error", "status": exc.http_status, "error": exc.message})
        return
    except Exception as exc:
        log.exception("unexpected error in a streamed push")
        yield _line({"event": "error", "status": 500, "error": f"internal error: {type(exc).__name__}"})
        return
    yield _line(_step("place", "start"))
    await registry.placed(generation)
    manifest = result["manifest"]
    placement = registry.placement_summary(manifest["name"], manifest["version"])
    yield _line(_step("place", "end"))
    yield _line({"event": "result", **result, "placement": placement})


def progress_stream(commit: Callable[[], Awaitable[dict[str, Any]]], registry: RegistryHandlers) -> StreamingResponse:
    """The streamed response of a push; ``commit`` runs the push and returns its JSON."""
    return StreamingResponse(_events(commit, registry), media_type=NDJSON)
