"""An asyncio token bucket for byte rates, changeable while callers wait.

Not ``aiolimiter``: its ``AsyncLimiter.acquire(amount)`` refuses an amount above its
capacity (a 4 MiB chunk against a 1 MiB/s cap would need a bucket of a whole chunk, which
is a burst of one), and its rate is fixed at construction. Nor central's
``central.origin.egress.TokenBucket`` (no live rate; and edges do not import central).

How it works: a caller takes its bytes at once and, when that leaves the bucket in debt,
waits until the refill since then has paid its share. Each waiter's mark is on a running
total of refilled bytes, so waiters finish in arrival order and an acquisition larger
than the burst is paid over time rather than refused. A rate change refills at the old
rate up to now and wakes every waiter, which re-reads how long it still has to wait at
the new rate; rate 0 means no cap and releases every waiter at once.

A cancelled acquisition keeps its bytes taken (the debt stays): a stream that dies while
waiting costs the cap what it asked for, which errs on the side of the cap.

Time is the event loop's clock (``loop.time()``), so virtual-time tests drive it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: Burst: this many seconds of the rate (a small fraction, so a cap is felt within a second).
BURST_S = 0.1
#: Longest sleep between two calls of an acquisition's ``recheck`` hook.
RECHECK_S = 0.05


class ByteRateLimiter:
    """A token bucket of bytes: ``rate`` bytes/s (0: no cap), a burst of ``burst_s`` seconds
    of it, the rate changeable while callers wait. One event loop. (Named for what it limits:
    central's ``TokenBucket`` is another class, with a fixed rate.)"""

    def __init__(self, rate: int = 0, burst_s: float = BURST_S) -> None:
        if rate < 0:
            raise ValueError("rate must be >= 0 (0: no cap)")
        self._burst_s = burst_s
        self._rate = rate
        self._tokens = float(self.burst)
        self._paid = 0.0  # every byte refilled so far, never capped: waiters' marks are on it
        self._stamp: float | None = None  # loop time of the last refill (None: not yet on a loop)
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def rate(self) -> int:
        """Bytes/s now; 0: no cap."""
        return self._rate

    @property
    def burst(self) -> int:
        """Bytes that may go at once after an idle spell."""
        return max(1, int(self._rate * self._burst_s))

    @property
    def waiting(self) -> int:
        """Acquisitions waiting now."""
        return len(self._waiters)

    def set_rate(self, rate: int) -> None:
        """Change the rate now; waiting acquisitions continue at the new one."""
        if rate < 0:
            raise ValueError("rate must be >= 0 (0: no cap)")
        if rate == self._rate:
            return
        self._refill()
        was_uncapped = self._rate == 0
        self._rate = rate
        # From no cap: start full, with no debt; else keep what was saved up, to the new burst.
        self._tokens = float(self.burst) if was_uncapped else min(self._tokens, float(self.burst))
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _refill(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._stamp is not None and self._rate > 0:
            earned = (now - self._stamp) * self._rate
            self._paid += earned
            self._tokens = min(float(self.burst), self._tokens + earned)
        self._stamp = now

    async def acquire(self, n: int, recheck: Callable[[], None] | None = None) -> None:
        """Return once ``n`` bytes may go (at once when there is no cap). ``recheck`` is called
        at least every ``RECHECK_S`` while waiting, e.g. to ``set_rate`` when a condition the
        rate depends on has changed."""
        if self._rate == 0 or n <= 0:
            return
        self._refill()
        self._tokens -= n
        if self._tokens >= 0:
            return
        mark = self._paid - self._tokens  # paid in full once the refill covers this debt
        loop = asyncio.get_running_loop()
        while self._rate > 0 and self._paid < mark:
            delay = (mark - self._paid) / self._rate
            if recheck is not None:
                delay = min(delay, RECHECK_S)
            waiter = loop.create_future()
            timer = loop.call_later(delay, _wake, waiter)
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiters.discard(waiter)
            if recheck is not None:
                recheck()
            self._refill()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
