"""FailoverCoordinator: tracker + NodeDirectory + PlacementService, no network."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest

from central.membership import NodeDirectory, NodeRecord
from central.membership.failover import FailoverCoordinator
from central.membership.tracker import MembershipTracker, NodeLiveness
from central.placement import PlacementService
from fleetwire.mqtt.payloads import Heartbeat, NodeStatus

# The tracker's suspect/dead timers run on the loop: a virtual clock jumps over the silences.
pytestmark = pytest.mark.virtual_time

V1 = ("resnet", "1")
V2 = ("bert", "3")
R = 2


def digests(count: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(count)]


def ms() -> int:
    return int(time.time() * 1000)


def hb(node_id: str, bdseq: int = 1, interval_s: float = 60.0, seq: int = 0) -> Heartbeat:
    return Heartbeat(
        node_id=node_id,
        bdseq=bdseq,
        seq=seq,
        ts=ms(),
        interval_s=interval_s,
        grpc_address=f"10.0.0.{node_id[-1]}:50061",
        http_address=f"10.0.0.{node_id[-1]}:8081",
    )


class Fleet:
    def __init__(self) -> None:
        self.placement = PlacementService(replicas=R)
        self.changes = 0
        self.nodes = NodeDirectory(self.placement, on_change=self._changed)
        self.placement.set_versions({V1: digests(60, "v1"), V2: digests(25, "v2")})
        self.tracker = MembershipTracker(default_interval_s=60)
        self.failover = FailoverCoordinator(self.tracker, self.nodes)

    def _changed(self) -> None:
        self.changes += 1

    def register(self, node_id: str, capacity: int = 1) -> None:
        """What the edge's gRPC Register does."""
        self.nodes.register(
            NodeRecord(node_id, f"10.0.0.{node_id[-1]}:50061", f"10.0.0.{node_id[-1]}:8081", capacity=capacity)
        )

    def ring(self) -> set[str]:
        return {m.node_id for m in self.placement.members()}

    def owners(self) -> dict[tuple[str, str], dict[str, list[str]]]:
        return {key: self.placement.placement(key) for key in (V1, V2)}

    def assert_r_live_owners(self, live: set[str]) -> None:
        want = min(R, len(live))
        for key, placement in self.owners().items():
            for digest, owners in placement.items():
                assert len(owners) == want, (key, digest, owners)
                assert len(set(owners)) == want
                assert set(owners) <= live, (key, digest, owners, live)


@pytest.fixture
async def fleet() -> Any:
    f = Fleet()
    for i in range(5):
        f.register(f"edge-{i}", capacity=2 if i == 0 else 1)
        f.tracker.on_status(f"edge-{i}", NodeStatus(state="online", bdseq=1, ts=ms()))
        f.tracker.on_heartbeat(f"edge-{i}", hb(f"edge-{i}"))
    yield f
    f.failover.close()
    f.tracker.close()


async def test_dead_node_leaves_the_ring_and_its_chunks_move(fleet: Fleet) -> None:
    everyone = {f"edge-{i}" for i in range(5)}
    fleet.assert_r_live_owners(everyone)
    before = fleet.owners()
    held = {d for p in before.values() for d, owners in p.items() if "edge-3" in owners}
    assert held, "edge-3 should own something"

    fleet.tracker.on_status("edge-3", NodeStatus(state="offline", bdseq=1, ts=0))  # its Last Will
    assert fleet.tracker.state_of("edge-3") is NodeLiveness.DEAD
    assert fleet.nodes.get("edge-3") is None
    assert fleet.ring() == everyone - {"edge-3"}
    fleet.assert_r_live_owners(everyone - {"edge-3"})
    after = fleet.owners()
    for key in (V1, V2):
        for digest, owners in after[key].items():
            old = before[key][digest]
            if "edge-3" not in old:
                assert owners == old  # sticky: only what the dead node held moved
            else:
                survivors = [o for o in old if o != "edge-3"]
                assert owners[: len(survivors)] == survivors  # surviving owner keeps its place
    assert fleet.failover.evictions == 1


async def test_timeout_death_evicts_and_rejoin_restores() -> None:
    fleet = Fleet()
    try:
        for i in range(4):
            fleet.register(f"edge-{i}", capacity=3 if i == 1 else 1)
            assert fleet.nodes.stream_opened(f"edge-{i}")
            fleet.tracker.on_heartbeat(f"edge-{i}", hb(f"edge-{i}", interval_s=60))
        fleet.tracker.on_heartbeat("edge-1", hb("edge-1", interval_s=0.05, seq=1))  # now goes silent
        deadline = time.monotonic() + 5
        while fleet.tracker.state_of("edge-1") is not NodeLiveness.DEAD:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert "edge-1" not in fleet.ring() and fleet.nodes.get("edge-1") is None
        fleet.assert_r_live_owners({"edge-0", "edge-2", "edge-3"})

        fleet.tracker.on_heartbeat("edge-1", hb("edge-1", interval_s=60, seq=2))  # partition heals
        record = fleet.nodes.get("edge-1")
        assert record is not None
        assert record.grpc_address == "10.0.0.1:50061" and record.http_address == "10.0.0.1:8081"
        assert record.capacity == 3  # what it had registered with before the eviction
        assert record.streams == 1  # its watch stream may still be open: still counted
        assert fleet.ring() == {"edge-0", "edge-1", "edge-2", "edge-3"}
        fleet.assert_r_live_owners(fleet.ring())
        assert fleet.failover.restorations == 1
    finally:
        fleet.failover.close()
        fleet.tracker.close()


async def test_new_birth_rejoins_with_the_last_known_addresses(fleet: Fleet) -> None:
    fleet.tracker.on_status("edge-2", NodeStatus(state="offline", bdseq=1, ts=ms() + 10))
    assert fleet.nodes.get("edge-2") is None
    fleet.tracker.on_status("edge-2", NodeStatus(state="online", bdseq=2, ts=ms() + 20))
    assert fleet.nodes.get("edge-2") is not None
    fleet.assert_r_live_owners({f"edge-{i}" for i in range(5)})


async def test_losing_all_owners_of_chunks_keeps_r_live_owners(fleet: Fleet) -> None:
    owners = fleet.placement.placement(V1)
    first = next(iter(owners.values()))
    for node_id in first:  # every owner of this chunk dies
        fleet.tracker.on_status(node_id, NodeStatus(state="offline", bdseq=1, ts=0))
    live = {f"edge-{i}" for i in range(5)} - set(first)
    assert fleet.ring() == live
    fleet.assert_r_live_owners(live)
    for node_id in live - {min(live)}:
        fleet.tracker.on_status(node_id, NodeStatus(state="offline", bdseq=1, ts=0))
    fleet.assert_r_live_owners({min(live)})  # one left: it owns everything, alone


async def test_unknown_nodes_and_addressless_births(fleet: Fleet) -> None:
    changes = fleet.changes
    # Dead but never registered: nothing to do.
    fleet.tracker.on_status("edge-8", NodeStatus(state="online", bdseq=1, ts=ms()))
    fleet.tracker.on_status("edge-8", NodeStatus(state="offline", bdseq=1, ts=0))
    assert fleet.nodes.get("edge-8") is None and fleet.changes == changes
    # Alive on MQTT but never registered over gRPC: neither its birth nor its heartbeat (which
    # anyone with its broker login can publish) registers it; its own Register will.
    fleet.tracker.on_status("edge-9", NodeStatus(state="online", bdseq=1, ts=ms()))
    fleet.tracker.on_heartbeat("edge-9", hb("edge-9"))
    assert fleet.nodes.get("edge-9") is None and "edge-9" not in fleet.ring()


async def test_a_registered_node_is_not_re_registered_by_heartbeats(fleet: Fleet) -> None:
    changes = fleet.changes
    record = fleet.nodes.get("edge-0")
    for seq in range(1, 5):
        fleet.tracker.on_heartbeat("edge-0", hb("edge-0", seq=seq))
    assert record is not None and fleet.nodes.get("edge-0") is record and record.capacity == 2
    assert fleet.changes == changes
    fleet.failover.close()
    fleet.tracker.on_status("edge-0", NodeStatus(state="offline", bdseq=1, ts=0))
    assert fleet.nodes.get("edge-0") is record  # closed: no longer reacts
