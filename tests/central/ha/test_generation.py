"""The generation wake-up between replicas on a real PostgreSQL: a write by one replica wakes
another's watcher by NOTIFY (the poll is set far out of reach), a burst of writes is one
wake-up, and a change made while the watcher's session was gone is still reported."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import psycopg
import pytest

from central.ha.fleet_store import FleetStore
from central.ha.generation import GenerationWatcher
from central.storage.postgres.pool import StoreUnavailable

#: Far beyond any wait below: whatever the watcher reports in a test, NOTIFY or a reconnect brought.
NO_POLL_S = 3600.0


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[tuple[FleetStore, FleetStore]]:
    """Two replicas' stores on one database."""
    first = FleetStore(postgres_url)
    second = FleetStore(postgres_url)
    yield first, second
    second.close()
    first.close()


class Recorder:
    """on_change that keeps every generation reported."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, gen: int) -> None:
        self.calls.append(gen)


@pytest.fixture
async def watched(
    postgres_url: str, replicas: tuple[FleetStore, FleetStore]
) -> AsyncIterator[tuple[GenerationWatcher, Recorder]]:
    recorder = Recorder()
    watcher = GenerationWatcher(postgres_url, recorder, poll_s=NO_POLL_S)
    await watcher.start()
    yield watcher, recorder
    await watcher.stop()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait for ``condition`` (a hang guard, not a timing threshold)."""
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


async def test_a_write_by_one_replica_wakes_another(
    replicas: tuple[FleetStore, FleetStore], watched: tuple[GenerationWatcher, Recorder]
) -> None:
    first, second = replicas
    watcher, recorder = watched
    assert watcher.connected and recorder.calls == [first.generation()]

    gen = await asyncio.to_thread(second.put_node, "edge-a", {"grpc": "10.0.0.1:50051"})
    await until(lambda: watcher.last_gen == gen, "the NOTIFY woke the watcher")
    gen = await asyncio.to_thread(first.bump)
    await until(lambda: watcher.last_gen == gen, "the NOTIFY woke the watcher")
    assert recorder.calls == [gen - 2, gen - 1, gen]


async def test_a_burst_of_writes_is_one_wake_up(
    replicas: tuple[FleetStore, FleetStore], watched: tuple[GenerationWatcher, Recorder]
) -> None:
    """200 writes land while this replica's loop is busy (they run on it, blocking): when it
    gets back to the watcher, the 200 NOTIFYs are one call with the last generation."""
    first, _ = replicas
    watcher, recorder = watched
    for _ in range(200):
        gen = first.bump()
    await until(lambda: watcher.last_gen == gen, "the watcher reached the last generation")
    assert recorder.calls[-1] == gen
    # Usually 2 or 3; a loaded server may forward the NOTIFYs in a few more packets.
    assert len(recorder.calls) <= 20
    assert recorder.calls == sorted(set(recorder.calls))


async def test_a_change_while_disconnected_is_reported_after_reconnect(
    postgres_url: str, replicas: tuple[FleetStore, FleetStore], watched: tuple[GenerationWatcher, Recorder]
) -> None:
    """The watcher's session is killed and new sessions refused while another replica writes,
    so that NOTIFY reaches no one; once PostgreSQL lets it back in, the re-read finds it."""
    first, _ = replicas
    watcher, recorder = watched
    pid = watcher.backend_pid
    assert pid is not None
    server, database = postgres_url.rsplit("/", 1)
    # From another database: PostgreSQL will not lock out the database one is connected to.
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false".encode())
        try:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            gen = await asyncio.to_thread(first.put_node, "edge-a", {"grpc": "10.0.0.1:50051"})
            await until(lambda: not watcher.connected, "the watcher saw its session end")
            await asyncio.sleep(0.3)  # a refused reconnect or two, on the backoff path
            assert watcher.last_gen < gen
        finally:
            admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true".encode())

    await until(lambda: watcher.last_gen == gen, "the reconnect's re-read reported the change")
    assert watcher.connected and watcher.reconnects == 1
    assert watcher.backend_pid not in (None, pid)
    assert recorder.calls[-1] == gen


async def test_the_poll_finds_a_change_nobody_announced(
    postgres_url: str, replicas: tuple[FleetStore, FleetStore]
) -> None:
    """A generation moved without NOTIFY (an operator, an old tool) is still seen, by the poll."""
    recorder = Recorder()
    watcher = GenerationWatcher(postgres_url, recorder, poll_s=0.2)
    await watcher.start()
    try:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("UPDATE ha_generation SET gen = gen + 10 WHERE id = 1")
        gen = replicas[0].generation()
        await until(lambda: watcher.last_gen == gen, "the poll re-read the generation")
        assert recorder.calls == [gen - 10, gen]
    finally:
        await watcher.stop()


async def test_start_fails_clearly_when_postgres_is_unreachable(postgres_url: str) -> None:
    wrong = postgres_url.replace("@", "x@", 1)  # wrong password: refused at once
    watcher = GenerationWatcher(wrong, Recorder(), connect_timeout_s=5)
    with pytest.raises(StoreUnavailable) as failed:
        await watcher.start()
    password = postgres_url.split(":")[2].split("@")[0]
    assert password not in str(failed.value)
    assert not watcher.connected
