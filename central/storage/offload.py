"""Central's store calls, off the event loop.

Every store (SQLite, PostgreSQL, the token files) is blocking. A call made on the event loop
holds every request of the process while it runs, ``/healthz`` and the gateway included:
milliseconds while the database answers, up to the pool's wait while PostgreSQL restarts.
The services' async methods therefore await their store through one ``StoreCalls``: a bounded
pool of worker threads of its own, so a burst of slow store calls can neither take every
thread of the loop's default executor (the push pipeline, the blob reads) nor start an
unbounded number of threads.

A thread of this pool waits for a pooled PostgreSQL connection as briefly as the loop did
(``request_wait``): a request whose store is away gets its 503 at once, not after the full
``store.connect_timeout_s`` with a worker held meanwhile. Work that may wait (the push
pipeline's commit, in the default executor) still waits the full timeout.

``threads=0`` runs every call inline on the loop, as central did before: only the benchmark
that measures the difference (``bench._ha_pg_restart``) sets it."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["StoreCalls", "request_wait"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_marks = threading.local()


def _mark_request_thread() -> None:
    _marks.request = True


def request_wait() -> bool:
    """Whether the calling thread serves a request: the event loop's thread, or one of a
    ``StoreCalls`` pool's. There a store waits briefly for a connection, never its full timeout."""
    if getattr(_marks, "request", False):
        return True
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class StoreCalls:
    """Runs blocking store calls in at most ``threads`` worker threads (see the module)."""

    def __init__(self, threads: int) -> None:
        """``threads`` 0: every call runs inline, on the caller's thread (the old behaviour)."""
        self.threads = threads
        self._executor = (
            ThreadPoolExecutor(threads, thread_name_prefix="store", initializer=_mark_request_thread)
            if threads > 0
            else None
        )

    async def __call__(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(*args, **kwargs)`` in a worker thread; its result or its exception."""
        if self._executor is None:
            return fn(*args, **kwargs)
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Let running calls finish; start no more."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)


#: Calls that run inline: for services built without a pool (tests of one service, tools).
INLINE = StoreCalls(0)
