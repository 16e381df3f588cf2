"""Bytes and recent bytes/s of one direction of chunk traffic, for status and metrics
(what an operator compares with the cap in force)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: The recent rate is over this many seconds.
WINDOW_S = 5.0


class RateMeter:
    """A byte total and the bytes/s over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._recent: deque[tuple[float, int]] = deque()  # (when, bytes)
        self._recent_bytes = 0
        self.total = 0

    def add(self, n: int) -> None:
        """Count ``n`` bytes moved now."""
        now = self._clock()
        self.total += n
        self._recent.append((now, n))
        self._recent_bytes += n
        self._forget(now)

    def rate(self) -> float:
        """Bytes/s over the window (0 when nothing moved in it)."""
        now = self._clock()
        self._forget(now)
        return self._recent_bytes / self._window_s

    def _forget(self, now: float) -> None:
        horizon = now - self._window_s
        while self._recent and self._recent[0][0] < horizon:
            self._recent_bytes -= self._recent.popleft()[1]
