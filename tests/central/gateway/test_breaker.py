"""The per-node circuit breaker, on an injected clock."""

from __future__ import annotations

import pytest

from central.gateway.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _breaker(threshold: int = 3, open_s: float = 2.0) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    return CircuitBreaker(failure_threshold=threshold, open_s=open_s, clock=clock), clock


def test_opens_after_threshold_consecutive_failures() -> None:
    b, _ = _breaker()
    for _ in range(2):
        assert b.allow()
        b.record_failure("boom")
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 2
    b.record_failure("boom")
    assert b.state is BreakerState.OPEN
    assert not b.allow() and not b.available()
    assert b.times_opened == 1 and b.last_failure == "boom"


def test_a_success_resets_the_count() -> None:
    b, _ = _breaker()
    b.record_failure()
    b.record_failure()
    b.record_success()
    b.record_failure()
    b.record_failure()
    assert b.state is BreakerState.CLOSED


def test_half_open_admits_one_trial_and_success_closes() -> None:
    b, clock = _breaker(open_s=2.0)
    for _ in range(3):
        b.record_failure()
    clock.now += 1.9
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.now += 0.2
    assert b.state is BreakerState.HALF_OPEN and b.available()
    assert b.allow()  # the trial
    assert not b.allow() and not b.available()  # only one at a time
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 0
    assert b.allow() and b.allow()


def test_trial_failure_reopens_for_another_period() -> None:
    b, clock = _breaker(open_s=2.0)
    for _ in range(3):
        b.record_failure()
    clock.now += 2.0
    assert b.allow()
    b.record_failure("still down")
    assert b.state is BreakerState.OPEN and b.times_opened == 2
    clock.now += 1.0
    assert not b.allow()
    clock.now += 1.0
    assert b.allow()


def test_released_trial_frees_the_slot() -> None:
    b, clock = _breaker(threshold=1)
    b.record_failure()
    clock.now += 2.0
    assert b.allow()
    b.release()
    assert b.state is BreakerState.HALF_OPEN and b.allow()


def test_straggler_failure_while_open_does_not_extend_the_period() -> None:
    b, clock = _breaker(threshold=1, open_s=2.0)
    b.record_failure()
    clock.now += 1.5
    b.record_failure()  # a request admitted before it opened
    clock.now += 0.5
    assert b.state is BreakerState.HALF_OPEN and b.times_opened == 1


def test_snapshot() -> None:
    b, clock = _breaker(threshold=1, open_s=2.0)
    assert b.snapshot()["state"] == "closed"
    b.record_failure("refused")
    clock.now += 0.5
    snap = b.snapshot()
    assert snap == {
        "state": "open",
        "consecutive_failures": 1,
        "times_opened": 1,
        "retry_in_s": 1.5,
        "last_failure": "refused",
    }


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError):
        CircuitBreaker(open_s=-1)
