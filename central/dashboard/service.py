"""The dashboard's service: snapshots on demand and live Server-Sent Events streams.

A stream sends a snapshot when it opens and then every ``interval_s``; between two
snapshots it sends each membership transition the moment the tracker makes it (a node
turning suspect or dead shows on the page without waiting for the next tick). Rollouts
come from a ``RolloutSource`` the transport supplies (central's own REST contract), so
the dashboard works with or without the rollout service: None means "not available".

Streams never end by themselves, and uvicorn waits for open responses before it stops,
so ``close()`` (called by the server before its HTTP listener stops) ends every one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from central.dashboard.snapshot import DashboardSources, build_snapshot, membership_event
from central.membership.liveness import NodeLiveness, TransitionInfo

__all__ = ["DashboardService", "RolloutSource", "sse_message"]

#: Returns the rollouts (newest first), or None when central has no rollout API.
RolloutSource = Callable[[], Awaitable[list[dict[str, Any]] | None]]

#: Membership messages queued for one slow client before it gets only snapshots.
_QUEUE_LIMIT = 1000
#: How long the browser waits before reconnecting a dropped stream, milliseconds.
RETRY_MS = 1000

_CLOSE = object()


def sse_message(event: str, data: Any) -> bytes:
    """One Server-Sent Events message (JSON data on a single line)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def _no_rollouts() -> list[dict[str, Any]] | None:
    return None


class DashboardService:
    """Builds snapshots of ``sources`` and feeds the live streams."""

    def __init__(self, sources: DashboardSources, interval_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self._sources = sources
        self.interval_s = interval_s
        self._queues: set[asyncio.Queue[object]] = set()
        self._closed = False
        self._shared: tuple[float, dict[str, Any]] | None = None
        # A shared snapshot older than a transition would undo, on a page, the state the
        # transition's message has just shown: any transition retires it.
        sources.liveness.subscribe(self._retire_shared)

    def _retire_shared(self, *_: object) -> None:
        self._shared = None

    @property
    def streams(self) -> int:
        """Streams open now."""
        return len(self._queues)

    async def snapshot(self, rollouts: RolloutSource = _no_rollouts) -> dict[str, Any]:
        """The dashboard document now."""
        listed = await rollouts()
        return await build_snapshot(self._sources, asyncio.get_running_loop().time(), listed)

    async def _tick_snapshot(self, rollouts: RolloutSource) -> dict[str, Any]:
        """A snapshot for a stream's tick: streams ticking within half an interval of each
        other share one, so ten open pages cost about one build per interval, not ten."""
        now = asyncio.get_running_loop().time()
        if self._shared is not None and now - self._shared[0] < self.interval_s / 2:
            return self._shared[1]
        doc = await self.snapshot(rollouts)
        self._shared = (now, doc)
        return doc

    async def stream(self, rollouts: RolloutSource = _no_rollouts) -> AsyncIterator[bytes]:
        """SSE bytes until the client goes away or ``close()``; see the module doc."""
        queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE_LIMIT)
        unsubscribe = self._sources.liveness.subscribe(self._enqueuer(queue))
        self._queues.add(queue)
        try:
            yield f"retry: {RETRY_MS}\n\n".encode()
            loop = asyncio.get_running_loop()
            while not self._closed:
                yield sse_message("snapshot", await self._tick_snapshot(rollouts))
                due = loop.time() + self.interval_s
                while (left := due - loop.time()) > 0:
                    try:  # asyncio.timeout: 3.11's wait_for can swallow a cancel
                        async with asyncio.timeout(left):
                            item = await queue.get()
                    except TimeoutError:
                        break
                    if item is _CLOSE:
                        return
                    yield sse_message("membership", item)
        finally:
            unsubscribe()
            self._queues.discard(queue)

    @staticmethod
    def _enqueuer(
        queue: asyncio.Queue[object],
    ) -> Callable[[str, NodeLiveness | None, NodeLiveness, TransitionInfo], None]:
        def on_transition(node_id: str, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
            if info.event is None:
                return  # same state, new addresses: the next snapshot shows them
            event = info.event.model_dump()
            with contextlib.suppress(asyncio.QueueFull):  # a stalled client still gets snapshots
                queue.put_nowait(membership_event(node_id, new.value, info.view, event))

        return on_transition

    def close(self) -> None:
        """End every open stream (at shutdown); new streams end after their first snapshot."""
        self._closed = True
        for queue in list(self._queues):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(_CLOSE)
            if queue.full():  # make room: closing matters more than one stale message
                queue.get_nowait()
                queue.put_nowait(_CLOSE)
