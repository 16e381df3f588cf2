"""A token bucket for central's egress, shared by every chunk stream.

Waiters are served in arrival order (asyncio.Lock is FIFO), so a stream that asked
first finishes first instead of all streams crawling to the end together."""

from __future__ import annotations

import asyncio
import time


class EgressBucket:
    """``rate`` bytes/s with a burst of ``burst`` bytes; rate 0 means no limit."""

    def __init__(self, rate: int, burst: int | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(256 * 1024, rate // 20)
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def consume(self, n: int) -> None:
        """Wait until ``n`` bytes may be sent."""
        if self.rate <= 0:
            return
        async with self._lock:
            self._refill()
            if self._tokens < n:
                await asyncio.sleep((n - self._tokens) / self.rate)
                self._refill()
            self._tokens -= n
