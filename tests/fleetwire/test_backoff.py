"""The shared retry policy: jittered exponential waits inside the doubling window, never
above the cap, different for every run; a run gives up, re-raises and stops as its loops need."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest
from tenacity import RetryCallState, retry_if_exception_type, retry_if_result

from fleetwire.backoff import retrying

BASE_S = 0.001
CAP_S = 0.016


class Down(Exception):
    """The service a loop retries is not there."""


async def waits(attempts: int, base_s: float = BASE_S, cap_s: float = CAP_S) -> list[float]:
    """The waits of a run whose every attempt fails."""
    seen: list[float] = []

    def record(state: RetryCallState) -> None:
        seen.append(state.upcoming_sleep)

    async def fail() -> bool:
        return False

    run = retrying(base_s, cap_s, retry=retry_if_result(lambda ok: not ok), before_sleep=record, attempts=attempts)
    assert await run(fail) is False  # the last attempt's result, once attempts are spent
    return seen


@pytest.fixture
def rng_state() -> Iterator[None]:
    """Put back the state of the process-wide generator (tenacity draws from it) after a test seeds it."""
    state = random.getstate()
    yield
    random.setstate(state)


async def test_each_wait_lies_in_the_upper_half_of_its_doubling_window_and_never_above_the_cap() -> None:
    got = await waits(attempts=10)
    assert len(got) == 9  # no wait after the last attempt
    for n, wait in enumerate(got, start=1):
        window = min(CAP_S, BASE_S * 2 ** (n - 1))
        assert window / 2 <= wait <= window <= CAP_S, (n, wait)
    assert max(got[:3]) < min(got[5:])  # windows 1-4 ms, then 16 ms: waits grow with failures


async def test_two_nodes_failing_together_wait_differently_even_at_the_cap() -> None:
    first, second = await asyncio.gather(waits(attempts=12), waits(attempts=12))
    assert first != second
    at_cap = first[6:]  # windows of 16 ms from attempt 5 on: without jitter every wait would be 16 ms
    assert len(set(at_cap)) == len(at_cap)


async def test_a_seeded_run_repeats_its_waits_and_another_seed_does_not(rng_state: None) -> None:
    random.seed(7)
    first = await waits(attempts=6)
    random.seed(7)
    assert await waits(attempts=6) == first
    random.seed(8)
    assert await waits(attempts=6) != first


async def test_an_exception_the_run_does_not_retry_ends_it_at_once() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        await retrying(BASE_S, CAP_S, retry=retry_if_exception_type(Down))(broken)
    assert calls == 1


async def test_the_last_exception_is_raised_as_it_is_once_attempts_are_spent() -> None:
    async def down() -> None:
        raise Down("central away")

    with pytest.raises(Down, match="central away"):
        await retrying(BASE_S, CAP_S, retry=retry_if_exception_type(Down), attempts=3)(down)


async def test_cancelling_a_run_ends_its_backoff_sleep_at_once() -> None:
    sleeping = asyncio.Event()

    async def down() -> None:
        raise Down

    run = retrying(60.0, 60.0, retry=retry_if_exception_type(Down), before_sleep=lambda _: sleeping.set())
    task = asyncio.create_task(run(down))
    await asyncio.wait_for(sleeping.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)  # far less than the 30-60 s wait it was in
