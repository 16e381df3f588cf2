"""The dashboard's service: snapshots on demand and live Server-Sent Events streams.

A stream sends a snapshot when it opens and then every ``interval_s``; between two
snapshots it sends each membership transition the moment the tracker makes it (a node
turning suspect or dead shows on the page without waiting for the next tick). Rollouts
come from a ``RolloutSource`` the transport supplies (central's own REST contract), so
the dashboard works with or without the rollout service: None means "not available".

A stream opened with a credential (``auth.protect_reads``) re-checks it at every tick,
through ``StillAllowed`` (the transport's check against the token store): once the token is
revoked the stream sends one ``revoked`` message saying why and ends, within one
``interval_s`` (1 s). The check is a poll, not a notification, on purpose: a revocation never
passes through central (``modelfleet token revoke`` writes the token file or PostgreSQL
directly, and with replicas it may be on another replica's store), so every replica must look
at the store anyway; a tick's check is one ``stat`` of the token file or one indexed
PostgreSQL lookup per open stream per interval.

Streams never end by themselves otherwise, and uvicorn waits for open responses before it
stops, so ``close()`` (called by the server before its HTTP listener stops) ends every one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from central.dashboard.snapshot import DashboardSources, build_snapshot, membership_event
from central.membership.liveness import NodeLiveness, TransitionInfo

__all__ = ["DashboardService", "RolloutSource", "StillAllowed", "sse_message"]

log = logging.getLogger(__name__)

#: Returns the rollouts (newest first), or None when central has no rollout API.
RolloutSource = Callable[[], Awaitable[list[dict[str, Any]] | None]]
#: Whether the credential a stream was opened with is still valid (not revoked); raises when
#: the token store cannot say.
StillAllowed = Callable[[], Awaitable[bool]]

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
        #: Streams ended because their token was revoked, or because the store could not say.
        self.closed_revoked = 0
        self.closed_unchecked = 0
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

    async def stream(
        self, rollouts: RolloutSource = _no_rollouts, allowed: StillAllowed | None = None, who: str = "anonymous"
    ) -> AsyncIterator[bytes]:
        """SSE bytes until the client goes away, ``close()``, or (with ``allowed``) its
        credential stops being valid; ``who`` names the credential in the log (never the
        token). See the module doc."""
        queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE_LIMIT)
        unsubscribe = self._sources.liveness.subscribe(self._enqueuer(queue))
        self._queues.add(queue)
        try:
            yield f"retry: {RETRY_MS}\n\n".encode()
            loop = asyncio.get_running_loop()
            while not self._closed:
                if allowed is not None and (ending := await self._refusal(allowed, who)) is not None:
                    yield ending
                    return
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

    async def _refusal(self, allowed: StillAllowed, who: str) -> bytes | None:
        """The last message of a stream whose credential no longer holds, else None. A store
        that cannot answer ends the stream too (the browser reconnects and is checked anew):
        a revocation must not outlive an outage of the store that holds it."""
        try:
            if await allowed():
                return None
        except Exception as exc:  # any store failure: psycopg, OSError, a corrupt file…
            self.closed_unchecked += 1
            log.warning("dashboard stream of %s ended: its token cannot be checked now: %s", who, exc)
            return sse_message("closed", {"reason": "the token of this stream cannot be checked now; reconnect"})
        self.closed_revoked += 1
        log.info("dashboard stream of %s ended: its token was revoked", who)
        return sse_message("revoked", {"reason": f"the token of this stream ({who}) was revoked"})

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
