"""An asyncio loop on virtual time, for tests of timers (suspect/dead, backoff, soak): idle
seconds take no wall time and no CPU hiccup makes a callback late. Tests opt in with the
``virtual_time`` marker (``tests/conftest.py`` gives such a test this loop)."""

from __future__ import annotations

import asyncio
import selectors


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without waiting; when nothing is ready and the loop's next timer is due in
    ``timeout``, moves the loop's clock forward by that much instead of sleeping."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only I/O (a thread's call_soon_threadsafe) can wake it
            return super().select(None)
        ready = super().select(0)
        if not ready and timeout > 0:
            self._loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` moves only by jumping to its next timer: timers,
    ``asyncio.sleep`` and ``call_at`` deadlines behave as on a normal loop, but idle
    seconds take no wall time, and no CPU hiccup makes a callback late."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now
