"""Is a node that did not answer in time down, or only busy?

A read timeout alone cannot tell a frozen node (SIGSTOP, a hung host: the kernel still
accepts TCP) from a live one running a long batch. ``GET /v2/health/live`` can: an edge
answers it from its event loop while its inference threads are busy. A live node's
timeout is the request's own (slow model, big batch): nothing against the node, and the
request is not sent elsewhere since the node is still running it. A node that does not
answer its liveness probe either is down: it counts as failed, and the request may go to
another node, as it is not running anywhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from central.gateway.breaker import CircuitBreaker
from central.gateway.candidates import Candidate
from central.gateway.outcomes import failure_of

LIVE_PATH = "/v2/health/live"


class LivenessProber:
    """Liveness probes over the gateway's pooled client, inline or in the background."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: Callable[[Candidate, str], str],
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        self._client = client
        self._url = url
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._background: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> int:
        """Background probes in flight."""
        return len(self._background)

    async def why_down(self, candidate: Candidate, within_s: float | None = None) -> str | None:
        """None when ``candidate`` answers its liveness probe (within ``within_s`` at most),
        else why it is taken for down."""
        read = self.read_timeout_s if within_s is None else max(0.001, min(self.read_timeout_s, within_s))
        timeout = httpx.Timeout(read, connect=min(self.connect_timeout_s, read))
        try:
            response = await self._client.get(self._url(candidate, LIVE_PATH), timeout=timeout)
        except httpx.RequestError as exc:
            return f"a request timed out and {LIVE_PATH} failed: {failure_of(exc).reason}"
        if response.status_code != 200:
            return f"a request timed out and {LIVE_PATH} answered {response.status_code}"
        return None

    def judge_later(self, candidate: Candidate, breaker: CircuitBreaker) -> None:
        """Probe in the background and tell ``breaker``: nothing (``release``) for a live
        node, a failure for a node that is down."""
        task = asyncio.get_running_loop().create_task(
            self._judge(candidate, breaker), name=f"probe-{candidate.node_id}"
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _judge(self, candidate: Candidate, breaker: CircuitBreaker) -> None:
        try:
            why = await self.why_down(candidate)
        except BaseException:
            breaker.release()
            raise
        if why is None:
            breaker.release()
        else:
            breaker.record_failure(why)

    async def close(self) -> None:
        """Cancel the background probes."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
