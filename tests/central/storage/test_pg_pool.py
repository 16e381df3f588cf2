"""The pool central's PostgreSQL stores share: an event loop (or a ``StoreCalls`` worker, which
serves a request) never waits long for it while the server is away, another thread still waits
the full timeout, and the pool finds a restarted server as soon as someone asks."""

from __future__ import annotations

import asyncio
import time

import pytest
from psycopg_pool import PoolTimeout

from central.storage.offload import StoreCalls
from central.storage.postgres.pool import ON_LOOP_WAIT_S, LoopSafePool, open_pool
from modelfleet.up.postgres import PostgresInstance

FULL_TIMEOUT_S = 3.0


def _wait_reachable(pool: LoopSafePool, timeout: float) -> float:
    """Seconds until ``pool.reachable()`` (AssertionError after ``timeout``)."""
    t0 = time.monotonic()
    while not pool.reachable():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"the pool did not reach the restarted server within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def _query_on_loop(pool: LoopSafePool) -> float:
    """Seconds a ``SELECT 1`` on an event-loop thread took to fail (it must fail)."""

    async def run() -> float:
        t0 = time.monotonic()
        with pytest.raises(PoolTimeout, match="PostgreSQL pool"), pool.connection() as conn:
            conn.execute("SELECT 1")
        return time.monotonic() - t0

    return asyncio.run(run())


def _query_in_store_worker(pool: LoopSafePool) -> str:
    """The error a ``SELECT 1`` run through ``StoreCalls`` fails with (it must fail), and the
    name of the thread it ran on."""

    def select() -> None:
        with pool.connection() as conn:
            conn.execute("SELECT 1")

    async def run() -> str:
        calls = StoreCalls(2)
        try:
            with pytest.raises(PoolTimeout) as failed:
                await calls(select)
            return str(failed.value)
        finally:
            calls.close()

    return asyncio.run(run())


def test_an_outage_costs_the_loop_milliseconds_a_thread_the_full_wait_and_a_restart_is_found_at_once(
    postgres: PostgresInstance, postgres_url: str
) -> None:
    pool, _ = open_pool(postgres_url, name="t", pool_size=2, connect_timeout_s=FULL_TIMEOUT_S)
    try:
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.reachable()
        postgres.stop_server()
        try:
            first = _query_on_loop(pool)  # finds the pooled session dead, then the server refusing
            assert first < ON_LOOP_WAIT_S + 0.5, first
            assert pool.last_connect_failed
            assert not pool.reachable()
            later = [_query_on_loop(pool) for _ in range(5)]
            assert max(later) < 0.2, later  # known down: only a connection ready now would do
            # A store worker serves a request: the same short wait (the pool's own refusal, not
            # psycopg's "couldn't get a connection after 3.00 sec").
            assert "PostgreSQL pool 't'" in _query_in_store_worker(pool)
            t0 = time.monotonic()
            with pytest.raises(PoolTimeout, match=r"after 3\.00 sec"), pool.connection() as conn:
                conn.execute("SELECT 1")  # off the loop: the full wait, as before
            assert time.monotonic() - t0 >= FULL_TIMEOUT_S - 0.1
        finally:
            postgres.start_again()
        found = _wait_reachable(pool, 5.0)
        assert found < 2.0, f"found the restarted server after {found:.2f} s"

        async def on_loop() -> object:
            with pool.connection() as conn:
                row = conn.execute("SELECT 1").fetchone()
            return row

        assert asyncio.run(on_loop()) == (1,)
    finally:
        pool.close()
