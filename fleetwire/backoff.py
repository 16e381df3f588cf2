"""The retry policy of every reconnect and retry loop, in central and on the edges.

Exponential backoff with *equal jitter*: after the n-th failure in a row a loop waits a
random time in ``[d/2, d]``, ``d = min(cap, base * 2**(n-1))``. Without jitter, a fleet
that lost central (or the broker) at the same moment retries in lockstep, every node at
the same instants, and hits the restarted service in waves. Equal rather than full jitter
(``[0, d]``): the floor keeps a retry from following a failure at once and keeps ``base``
and ``cap`` meaning the first and the longest wait, while a fleet still spreads over half
of each window.

Built on tenacity: its wait strategies compute the delays and ``AsyncRetrying`` runs the
loops (a stop cancels the task, which ends a backoff sleep at once). Not stamina (a
wrapper of tenacity): its jitter is added to the exponential delay before the cap, so at
the cap every node waits exactly ``cap`` again, and it is made for bounded retries of one
call, not for loops that retry for ever, log each retry their own way or start over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    after_nothing,
    stop_after_attempt,
    stop_never,
    wait_exponential,
    wait_full_jitter,
)
from tenacity.retry import retry_base
from tenacity.wait import wait_base

__all__ = ["equal_jitter", "retrying"]

#: A hook that tenacity calls with the state of the run (before a sleep, after an attempt).
Hook = Callable[[RetryCallState], None]


def equal_jitter(base_s: float, cap_s: float) -> wait_base:
    """The wait after a run's n-th attempt failed: uniform in ``[d/2, d]``, ``d = min(cap_s, base_s * 2**(n-1))``."""
    half_base, half_cap = base_s / 2, cap_s / 2
    return wait_exponential(multiplier=half_base, max=half_cap) + wait_full_jitter(multiplier=half_base, max=half_cap)


def retrying(
    base_s: float,
    cap_s: float,
    *,
    retry: retry_base,
    before_sleep: Hook | None = None,
    after: Hook | None = None,
    attempts: int | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncRetrying:
    """A run of attempts that ``retry`` accepts, ``equal_jitter`` apart, for ever or ``attempts`` times.

    An outcome that ``retry`` refuses ends the run: a result is returned, an exception
    raised as it is. Once ``attempts`` are spent, the last attempt's outcome is returned
    (or raised) the same way. ``before_sleep`` sees ``state.upcoming_sleep`` (to log it);
    ``after`` runs before the wait is chosen. Make one per run: tenacity keeps the run's
    state on this object, so concurrent runs must not share it. ``sleep``: how a wait is
    slept (default ``asyncio.sleep``); a loop that may be told to retry at once passes one
    that a wake-up cuts short.
    """
    return AsyncRetrying(
        wait=equal_jitter(base_s, cap_s),
        stop=stop_never if attempts is None else stop_after_attempt(attempts),
        retry=retry,
        before_sleep=before_sleep,
        after=after or after_nothing,
        retry_error_callback=_last_outcome,
        reraise=True,
        sleep=sleep or asyncio.sleep,
    )


def _last_outcome(state: RetryCallState) -> Any:
    """What the last attempt returned, or its exception raised."""
    assert state.outcome is not None  # a run stops after an attempt, never before the first
    return state.outcome.result()
