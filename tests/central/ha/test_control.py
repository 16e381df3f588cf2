"""Replica control sessions on a real PostgreSQL: one leader, partitions split by rendezvous,
takeover when the leader stops or its session dies, hand-over when a replica joins, and never
two owners of a partition at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import psycopg
import pytest

from central.ha.control import ControlUnavailable, ReplicaControl
from central.ha.fencing import Fenced, check_leader_epoch
from central.ha.rendezvous import assignment, partitions_of
from central.ha.session import LEADER_KEY, PARTITION_BASE, application_name
from modelfleet.up.ports import free_port

PARTITIONS = 64
TICK_S = 0.2
TTL_S = 2.0


@dataclass
class Recorder:
    """A listener that keeps every call, in order."""

    events: list[tuple[str, object]] = field(default_factory=list)

    def leadership_gained(self, epoch: int) -> None:
        self.events.append(("leader", epoch))

    def leadership_lost(self) -> None:
        self.events.append(("lost", None))

    def partitions_gained(self, gained: dict[int, int]) -> None:
        self.events.append(("gained", dict(gained)))

    def partitions_released(self, released: set[int]) -> None:
        self.events.append(("released", set(released)))

    def gained(self) -> set[int]:
        """Every partition ever gained."""
        return {k for kind, arg in self.events if kind == "gained" and isinstance(arg, dict) for k in arg}

    def released(self) -> set[int]:
        """Every partition ever released."""
        return {k for kind, arg in self.events if kind == "released" and isinstance(arg, set) for k in arg}


@dataclass
class Replica:
    control: ReplicaControl
    recorder: Recorder


Start = Callable[[str], Awaitable[Replica]]


@pytest.fixture
async def start_replica(ha_url: str) -> AsyncIterator[Start]:
    """Starts replicas on ``ha_url``; stops those still running at the end."""
    started: list[Replica] = []

    async def start(replica_id: str) -> Replica:
        recorder = Recorder()
        control = ReplicaControl(
            ha_url,
            replica_id,
            http_url=f"http://{replica_id}:8080",
            grpc_address=f"{replica_id}:50051",
            partitions=PARTITIONS,
            ttl_s=TTL_S,
            tick_s=TICK_S,
            connect_timeout_s=5.0,
            listener=recorder,
        )
        await control.start()
        replica = Replica(control, recorder)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        await replica.control.stop()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Wait for ``condition`` (a generous bound: these tests count ticks, not seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


def settled(replicas: list[Replica]) -> bool:
    """Every live replica holds exactly its rendezvous share, and one of them leads."""
    ids = [r.control.replica_id for r in replicas]
    shares_held = all(set(r.control.owned) == partitions_of(r.control.replica_id, ids, PARTITIONS) for r in replicas)
    return shares_held and sum(r.control.is_leader for r in replicas) == 1


def assert_one_owner_each(url: str, replicas: list[Replica]) -> None:
    """From PostgreSQL, while the event loop is blocked (so no replica changes its mind): every
    partition a replica believes it owns is locked by that replica's session, recorded as its
    in ``ha_partitions`` with the same epoch, and believed owned by no other replica."""
    believed: dict[int, str] = {}
    for r in replicas:
        for k in r.control.owned:
            assert k not in believed, f"partition {k} owned by {believed[k]} and {r.control.replica_id}"
            believed[k] = r.control.replica_id
    with psycopg.connect(url, autocommit=True) as conn:
        held = conn.execute(
            "SELECT ((l.classid::bigint << 32) | l.objid::bigint) - %s, a.application_name"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
            " AND ((l.classid::bigint << 32) | l.objid::bigint) - %s BETWEEN 0 AND %s",
            (PARTITION_BASE, PARTITION_BASE, PARTITIONS - 1),
        ).fetchall()
        locks: dict[int, str] = {int(k): str(name) for k, name in held}
        assert len(locks) == len(held), "a partition lock held by two sessions"
        table = {
            int(k): (str(owner), int(epoch))
            for k, owner, epoch in conn.execute("SELECT partition, replica_id, epoch FROM ha_partitions")
        }
    by_id = {r.control.replica_id: r for r in replicas}
    for k, owner in believed.items():
        assert locks.get(k) == application_name(owner), (k, owner, locks.get(k))
        assert table[k] == (owner, by_id[owner].control.owned[k]), (k, owner, table[k])


async def test_three_replicas_one_leader_partitions_split_and_takeover_when_the_leader_stops(
    ha_url: str, start_replica: Start
) -> None:
    replicas = [await start_replica(rid) for rid in ("r1", "r2", "r3")]
    await until(lambda: settled(replicas), "one leader, partitions split by rendezvous")
    assert_one_owner_each(ha_url, replicas)
    counts = [len(r.control.owned) for r in replicas]
    assert sum(counts) == PARTITIONS and max(counts) / (PARTITIONS / 3) <= 1.5, counts

    leader = next(r for r in replicas if r.control.is_leader)
    old_epoch = leader.control.leader_epoch
    assert old_epoch is not None
    leader_id = leader.control.replica_id
    await until(lambda: all(r.control.leader_id() == leader_id for r in replicas), "everyone sees the leader")
    for r in replicas:
        assert [i.replica_id for i in r.control.replicas()] == ["r1", "r2", "r3"]
        assert [i.leader for i in r.control.replicas()] == [
            i.replica_id == leader.control.replica_id for i in r.control.replicas()
        ]

    survivors = [r for r in replicas if r is not leader]
    ticks_before = {r.control.replica_id: r.control.ticks for r in survivors}
    held = set(leader.control.owned)
    await leader.control.stop()
    assert leader.recorder.events[-2:] == [("lost", None), ("released", held)]
    assert not leader.control.is_leader and not leader.control.owned and not leader.control.connected

    await until(lambda: any(r.control.is_leader for r in survivors), "a survivor leads")
    new_leader = next(r for r in survivors if r.control.is_leader)
    took = new_leader.control.ticks - ticks_before[new_leader.control.replica_id]
    assert took <= 2, f"leadership moved after {took} ticks"
    new_epoch = new_leader.control.leader_epoch
    assert new_epoch is not None and new_epoch > old_epoch
    await until(lambda: settled(survivors), "the stopped leader's partitions shared by the survivors")
    assert_one_owner_each(ha_url, survivors)
    with psycopg.connect(ha_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM ha_replicas WHERE replica_id = %s", (leader.control.replica_id,)
        ).fetchone() == (0,)

    with psycopg.connect(ha_url) as conn, conn.transaction(), pytest.raises(Fenced):
        check_leader_epoch(conn, old_epoch)
    with psycopg.connect(ha_url) as conn, conn.transaction():
        check_leader_epoch(conn, new_epoch)


async def test_a_killed_session_loses_its_roles_at_once_and_comes_back_as_a_follower(
    ha_url: str, start_replica: Start
) -> None:
    replicas = [await start_replica(rid) for rid in ("r1", "r2", "r3")]
    await until(lambda: settled(replicas), "settled")
    victim = next(r for r in replicas if r.control.is_leader)
    survivors = [r for r in replicas if r is not victim]
    share = set(victim.control.owned)
    epochs = dict(victim.control.owned)
    old_epoch = victim.control.leader_epoch
    assert old_epoch is not None

    # What SIGKILL does as PostgreSQL sees it: the session ends, its locks with it.
    with psycopg.connect(ha_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(backend_pid, 5000) FROM ha_replicas WHERE replica_id = %s",
            (victim.control.replica_id,),
        )
    await until(lambda: ("lost", None) in victim.recorder.events, "the victim hears it lost leadership")
    assert share <= victim.recorder.released()
    await until(lambda: any(r.control.is_leader for r in survivors), "a survivor leads")
    new_epoch = next(r.control.leader_epoch for r in survivors if r.control.is_leader)
    assert new_epoch is not None and new_epoch > old_epoch

    await until(lambda: victim.control.connected and victim.control.ticks > 0 and settled(replicas), "rejoined")
    assert not victim.control.is_leader, "the victim came back as a follower"
    moved_and_back = set().union(*(r.recorder.gained() & r.recorder.released() for r in survivors))
    assert moved_and_back == share, "its partitions went to the survivors and came back"
    assert set(victim.control.owned) == share
    assert all(victim.control.owned[k] > epochs[k] for k in share), "every hand-over bumped the epoch"
    assert_one_owner_each(ha_url, replicas)


async def test_a_joining_replica_takes_its_share_without_two_owners_at_once(ha_url: str, start_replica: Start) -> None:
    replicas = [await start_replica(rid) for rid in ("r1", "r2")]
    await until(lambda: settled(replicas), "two replicas settled")
    before = {k: (r.control.replica_id, epoch) for r in replicas for k, epoch in r.control.owned.items()}
    share = partitions_of("r3", ["r1", "r2", "r3"], PARTITIONS)
    after = assignment(("r1", "r2", "r3"), PARTITIONS)
    moved = {k for k, (owner, _) in before.items() if after[k] != owner}
    for r in replicas:
        r.recorder.events.clear()  # from here on: what the join does

    stop_watching = asyncio.Event()

    async def watch() -> int:
        looks = 0
        while not stop_watching.is_set():
            assert_one_owner_each(ha_url, replicas)  # blocks the loop: a consistent instant
            looks += 1
            await asyncio.sleep(0.01)
        return looks

    watcher = asyncio.create_task(watch())
    joiner = await start_replica("r3")
    replicas.append(joiner)
    await until(lambda: settled(replicas), "three replicas settled")
    stop_watching.set()
    assert await watcher > 5

    assert joiner.recorder.gained() == share and not joiner.control.is_leader
    assert set().union(*(r.recorder.released() for r in replicas[:2])) == moved, "exactly the moved ones left"
    for k in moved:
        owner = next(r for r in replicas if k in r.control.owned)
        assert owner.control.owned[k] > before[k][1], f"partition {k}: epoch did not grow"
    unmoved = {k: v for k, v in before.items() if k not in moved}
    held = {k: (r.control.replica_id, e) for r in replicas[:2] for k, e in r.control.owned.items() if k not in moved}
    assert unmoved == held, "every partition that stays keeps its owner and epoch"


async def test_a_hung_replica_is_ended_after_its_ttl_and_loses_the_lock(ha_url: str, start_replica: Start) -> None:
    # A "hung" replica: its session is open and holds the leader lock, but it stopped renewing.
    hung = await psycopg.AsyncConnection.connect(ha_url, autocommit=True, application_name=application_name("hung"))
    try:
        await hung.execute("SELECT pg_advisory_lock(%s)", (LEADER_KEY,))
        await hung.execute(
            "INSERT INTO ha_replicas (replica_id, http_url, grpc_address, backend_pid, seen_at)"
            " VALUES ('hung', '', '', pg_backend_pid(), now() - make_interval(secs => %s))",
            (TTL_S * 2,),
        )
        replica = await start_replica("r1")
        await until(lambda: replica.control.is_leader, "the healthy replica leads")
        with pytest.raises(psycopg.OperationalError):
            await hung.execute("SELECT 1")
    finally:
        await hung.close()
    assert [i.replica_id for i in replica.control.replicas()] == ["r1"]


async def test_a_second_process_with_the_same_replica_id_is_refused(ha_url: str, start_replica: Start) -> None:
    await start_replica("r1")
    with pytest.raises(ControlUnavailable, match="in use"):
        await start_replica("r1")


async def test_an_unreachable_database_fails_start_with_the_url_masked() -> None:
    url = f"postgresql://modelfleet:secret@127.0.0.1:{free_port()}/modelfleet"
    control = ReplicaControl(
        url,
        "r1",
        http_url="http://r1:8080",
        grpc_address="r1:50051",
        partitions=PARTITIONS,
        ttl_s=TTL_S,
        tick_s=TICK_S,
        connect_timeout_s=2.0,
        listener=Recorder(),
    )
    with pytest.raises(ControlUnavailable, match=r"modelfleet:\*\*\*@127\.0\.0\.1") as raised:
        await control.start()
    assert "secret" not in str(raised.value)
    assert not control.connected
    await control.stop()
