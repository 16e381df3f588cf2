"""A watch's judging passes: one pass, then a sleep, until stopped.

A task rather than a timer, so a pass can await its store calls (in ``StoreCalls``' worker
threads) while the loop serves requests, and the next pass starts only once this one ended.
One failing pass is logged and the next runs as usual: a watch never stops on a bad pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["PassLoop"]

log = logging.getLogger(__name__)


class PassLoop:
    """Runs ``judge()`` every ``interval_s`` (plus the pass's own time) once started."""

    def __init__(self, judge: Callable[[], Awaitable[None]], name: str, failure: str) -> None:
        """``name``: the task's; ``failure``: what the log says a failed pass was doing."""
        self._judge = judge
        self._name = name
        self._failure = failure
        self._task: asyncio.Task[None] | None = None

    def start(self, interval_s: float) -> None:
        """Start the passes (needs the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run(interval_s), name=self._name)

    def stop(self) -> None:
        """Stop after (or instead of) the pass under way."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, interval_s: float) -> None:
        while True:
            try:
                await self._judge()
            except Exception:
                log.exception("%s failed", self._failure)
            await asyncio.sleep(interval_s)
