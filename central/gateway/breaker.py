"""A circuit breaker per node, so the gateway stops sending requests to a node that
keeps failing and probes it again after a while.

closed ──(failure_threshold consecutive failures)──▶ open ──(open_s elapsed)──▶ half-open
half-open: exactly one trial request is let through; its success closes the breaker,
its failure opens it again for another ``open_s``.

Not thread-safe: one breaker is used from one event loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any


class BreakerState(StrEnum):
    """Where a breaker is."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One node's breaker. ``clock`` returns seconds (monotonic); inject one in tests."""

    def __init__(
        self, failure_threshold: int = 3, open_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if open_s < 0:
            raise ValueError("open_s must not be negative")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self.times_opened = 0
        self.last_failure: str | None = None

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose ``open_s`` has passed reads half-open."""
        if self._state is BreakerState.OPEN and self._elapsed():
            return BreakerState.HALF_OPEN
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Failures since the last success."""
        return self._failures

    def _elapsed(self) -> bool:
        return self._clock() - self._opened_at >= self.open_s

    def available(self) -> bool:
        """Whether ``allow`` would let a request through now (without taking the trial)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        return state is BreakerState.HALF_OPEN and not self._trial_in_flight

    def allow(self) -> bool:
        """Admit one request: always when closed; when half-open only the one trial (until
        its outcome is recorded or it is released); never while open. A caller that got
        True must end with ``record_success``, ``record_failure`` or ``release``."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._trial_in_flight:
            return False
        self._state = BreakerState.HALF_OPEN
        self._trial_in_flight = True
        return True

    def record_success(self) -> None:
        """The node answered (any non-5xx status): close the breaker."""
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._trial_in_flight = False

    def record_failure(self, reason: str | None = None) -> None:
        """The node failed a request (unreachable, timed out, 5xx)."""
        self._failures += 1
        if reason is not None:
            self.last_failure = reason
        if self.state is BreakerState.HALF_OPEN or (
            self._state is BreakerState.CLOSED and self._failures >= self.failure_threshold
        ):
            self._open()
        # already open: a straggler admitted before it opened; the open period is not extended

    def release(self) -> None:
        """An admitted request ended without telling anything about the node (cancelled,
        or never sent): free the half-open trial for the next request."""
        if self._state is BreakerState.HALF_OPEN:
            self._trial_in_flight = False

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._trial_in_flight = False
        self.times_opened += 1

    def snapshot(self) -> dict[str, Any]:
        """State for the gateway's status endpoint."""
        state = self.state
        retry_in = max(0.0, self._opened_at + self.open_s - self._clock()) if state is BreakerState.OPEN else 0.0
        return {
            "state": state.value,
            "consecutive_failures": self._failures,
            "times_opened": self.times_opened,
            "retry_in_s": round(retry_in, 3),
            "last_failure": self.last_failure,
        }
