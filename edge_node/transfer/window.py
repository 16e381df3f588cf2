"""``ByteWindow``: how many capped chunk bytes may be on their way at once.

A chunk fetch has a deadline (``fetch.peer_timeout_s``, ``origin_timeout_s``), and a
fetch cap paces its bytes as they arrive, so its call lasts about (bytes on their way
across all fetches) / cap. With 8 and more fetches in flight and a low cap, that passes
the deadline: the fetch fails after moving most of its bytes and starts again elsewhere.
So while a cap is set, a fetch first reserves its chunk's bytes in a window of
``WINDOW_S`` seconds of the cap (waiting, before its call starts, for earlier ones to
finish) and every call finishes in about that time. One fetch always fits, however big."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

#: Seconds of the cap that may be on their way at once (well under the 30 s peer deadline).
WINDOW_S = 8.0


class ByteWindow:
    """Reservations of bytes against ``rate`` × ``WINDOW_S`` (rate 0: no limit). One loop."""

    def __init__(self, rate: int = 0, window_s: float = WINDOW_S) -> None:
        self._rate = rate
        self._window_s = window_s
        self._reserved = 0
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def reserved(self) -> int:
        """Bytes reserved by fetches under way."""
        return self._reserved

    def set_rate(self, rate: int) -> None:
        """Change the window's rate; waiting reservations re-check."""
        if rate == self._rate:
            return
        self._rate = rate
        self._wake()

    def _fits(self, n: int) -> bool:
        return self._rate == 0 or self._reserved == 0 or self._reserved + n <= self._rate * self._window_s

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    @asynccontextmanager
    async def reserve(self, n: int) -> AsyncIterator[None]:
        """Hold ``n`` bytes of the window for the block (waits, before it, until they fit)."""
        while not self._fits(n):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
        self._reserved += n
        try:
            yield
        finally:
            self._reserved -= n
            self._wake()
