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
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from central.core import Central
from central.errors import CentralError
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


def placement_summary(central: Central, name: str, version: str) -> dict[str, Any]:
    """How many chunks of the version each node owns (empty while no edge has joined,
    or when the version is stored without being served)."""
    owners: Counter[str] = Counter()
    for nodes in central.placement.placement((name, version)).values():
        owners.update(nodes)
    return {"nodes": len(central.placement.members()), "owners": dict(sorted(owners.items()))}


async def _placed(central: Central, generation: int) -> None:
    """Let the coalesced desired-state refresh that the commit scheduled run."""
    for _ in range(10):
        if central.desired.generation != generation:
            return
        await asyncio.sleep(0)


async def _events(commit: Callable[[], Awaitable[dict[str, Any]]], central: Central) -> AsyncIterator[bytes]:
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

    generation = central.desired.generation
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
    await _placed(central, generation)
    manifest = result["manifest"]
    placement = placement_summary(central, manifest["name"], manifest["version"])
    yield _line(_step("place", "end"))
    yield _line({"event": "result", **result, "placement": placement})


def progress_stream(commit: Callable[[], Awaitable[dict[str, Any]]], central: Central) -> StreamingResponse:
    """The streamed response of a push; ``commit`` runs the push and returns its JSON."""
    return StreamingResponse(_events(commit, central), media_type=NDJSON)
