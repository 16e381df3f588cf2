"""The shared fleet state on a real PostgreSQL: what one replica writes another reads, every
write moves the generation by one, and a fenced writer whose epoch is gone writes nothing,
even when the election that deposed it is still in flight."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from central.ha.fencing import Fenced
from central.ha.fleet_store import FleetSnapshot, FleetStore, LivenessRow


def sql(url: str, query: str, args: tuple[Any, ...] = ()) -> None:
    """Run one statement as an operator (or another replica) would, committed at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query.encode(), args)


def snap(store: FleetStore) -> FleetSnapshot:
    found = store.snapshot()
    assert found is not None
    return found


def alive(node_id: str, partition: int, *ready: tuple[str, str]) -> LivenessRow:
    models = tuple({"name": m, "version": v, "state": "ready", "error": None} for m, v in ready)
    return LivenessRow(node_id, partition, "alive", f"http://{node_id}:8080", models)


@pytest.fixture
def store(postgres_url: str) -> Iterator[FleetStore]:
    fleet = FleetStore(postgres_url)
    yield fleet
    fleet.close()


@pytest.fixture
def other(postgres_url: str, store: FleetStore) -> Iterator[FleetStore]:
    """A second replica's store on the same database."""
    fleet = FleetStore(postgres_url)
    yield fleet
    fleet.close()


def test_registrations_round_trip_between_replicas(store: FleetStore, other: FleetStore) -> None:
    gen0 = store.generation()
    assert store.put_node("edge-a", {"grpc": "10.0.0.1:50051", "labels": {"zone": "a"}}) == gen0 + 1
    assert other.put_node("edge-b", {"grpc": "10.0.0.2:50051"}) == gen0 + 2
    assert store.put_node("edge-a", {"grpc": "10.0.0.9:50051"}) == gen0 + 3

    seen = snap(other)
    assert seen.gen == gen0 + 3
    assert seen.nodes == {"edge-a": {"grpc": "10.0.0.9:50051"}, "edge-b": {"grpc": "10.0.0.2:50051"}}
    assert seen.liveness == {} and seen.placement is None and seen.placement_epoch is None
    assert other.snapshot(since_gen=seen.gen) is None

    assert store.remove_node("edge-a") == gen0 + 4
    assert other.remove_node("edge-a") is None  # unknown now: nobody is woken
    assert store.generation() == gen0 + 4
    assert snap(store).nodes == {"edge-b": {"grpc": "10.0.0.2:50051"}}
    assert store.bump() == gen0 + 5


def test_liveness_is_fenced_by_the_partition_epoch(postgres_url: str, store: FleetStore) -> None:
    sql(postgres_url, "INSERT INTO ha_partitions (partition, epoch, replica_id) VALUES (3, 2, 'r1')")
    rows = [alive("edge-a", 3, ("mlp", "v1"), ("mlp", "v2")), alive("edge-x", 4)]
    gen = store.put_liveness(3, 2, rows)
    assert snap(store).liveness == {"edge-a": rows[0]}  # edge-x belongs to partition 4's owner

    sql(postgres_url, "UPDATE ha_partitions SET epoch = 3, replica_id = 'r2' WHERE partition = 3")
    with pytest.raises(Fenced, match=r"epoch 2 is stale \(current: 3\)"):
        store.put_liveness(3, 2, [LivenessRow("edge-a", 3, "dead", "", ())])
    with pytest.raises(Fenced):
        store.forget_liveness(3, 2, ["edge-a"])
    after = snap(store)
    assert after.gen == gen and after.liveness == {"edge-a": rows[0]}

    assert store.put_liveness(3, 3, [LivenessRow("edge-a", 3, "suspect", "http://edge-a:8080", ())]) == gen + 1
    assert snap(store).liveness["edge-a"].state == "suspect"
    assert store.forget_liveness(3, 3, ["edge-a", "edge-unknown"]) == gen + 2
    assert store.forget_liveness(3, 3, ["edge-a"]) == gen + 2  # nothing left to forget: no bump
    assert snap(store).liveness == {}
    with pytest.raises(Fenced):  # nobody ever owned partition 9
        store.put_liveness(9, 0, [alive("edge-z", 9)])


def test_placement_is_fenced_by_the_leader_epoch(postgres_url: str, store: FleetStore, other: FleetStore) -> None:
    sql(postgres_url, "UPDATE ha_leader SET epoch = 2, replica_id = 'r1' WHERE id = 1")
    body = {"assignments": {"mlp:v1": ["edge-a", "edge-b"]}}
    gen = store.put_placement(2, body)
    seen = snap(other)
    assert (seen.placement, seen.placement_epoch, seen.gen) == (body, 2, gen)

    sql(postgres_url, "UPDATE ha_leader SET epoch = 3, replica_id = 'r2' WHERE id = 1")
    with pytest.raises(Fenced):
        store.put_placement(2, {"assignments": {}})
    assert other.snapshot(since_gen=gen) is None
    assert snap(other).placement == body


def test_liveness_rejects_an_unknown_state() -> None:
    with pytest.raises(ValueError, match="gone"):
        LivenessRow("edge-a", 0, "gone", "", ())


ELECTIONS: dict[str, tuple[str, Callable[[FleetStore], int]]] = {
    "leader": (
        "UPDATE ha_leader SET epoch = epoch + 1 WHERE id = 1",
        lambda store: store.put_placement(2, {"assignments": {"late": []}}),
    ),
    "partition": (
        "UPDATE ha_partitions SET epoch = epoch + 1 WHERE partition = 3",
        lambda store: store.put_liveness(3, 2, [LivenessRow("edge-a", 3, "dead", "", ())]),
    ),
}


@pytest.mark.parametrize("kind", sorted(ELECTIONS))
def test_a_write_racing_an_election_loses(postgres_url: str, store: FleetStore, kind: str) -> None:
    """The old owner's write starts while the election's transaction holds the epoch row: it
    waits on the row lock (checked in pg_stat_activity, not by sleeping), then sees the new
    epoch and writes nothing."""
    sql(postgres_url, "UPDATE ha_leader SET epoch = 2 WHERE id = 1")
    sql(postgres_url, "INSERT INTO ha_partitions (partition, epoch) VALUES (3, 2)")
    store.put_placement(2, {"assignments": {}})
    store.put_liveness(3, 2, [alive("edge-a", 3)])
    before = snap(store)
    election_sql, old_write = ELECTIONS[kind]

    with psycopg.connect(postgres_url) as election, ThreadPoolExecutor(1) as pool:
        election.execute(election_sql.encode())  # the new owner's transaction, still open
        write = pool.submit(old_write, store)
        wait_until_blocked_by(postgres_url, election.info.backend_pid)
        election.commit()
        with pytest.raises(Fenced):
            write.result(timeout=30)

    after = snap(store)
    assert (after.gen, after.placement, after.liveness) == (before.gen, before.placement, before.liveness)


def wait_until_blocked_by(url: str, pid: int) -> None:
    """Return once some session waits on a lock that ``pid`` holds."""
    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,))
            found = row.fetchone()
            if found is not None and found[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("the old owner's write never waited on the election's lock")


def test_a_nodes_clock_offset_reaches_the_other_replicas(
    postgres_url: str, store: FleetStore, other: FleetStore
) -> None:
    sql(postgres_url, "INSERT INTO ha_partitions (partition, epoch, replica_id) VALUES (5, 1, 'r1')")
    timed = LivenessRow("edge-c", 5, "alive", "http://edge-c:8080", (), clock=(-12.5, 0.4))
    gen = store.put_liveness(5, 1, [timed, alive("edge-d", 5)])
    seen = snap(other).liveness
    assert seen["edge-c"].clock == (-12.5, 0.4) and seen["edge-d"].clock is None
    changes = other.changes(gen - 1)
    assert changes is not None and changes.liveness["edge-c"].clock == (-12.5, 0.4)
