"""Statuses and heartbeats that do not come from the node they name (an anonymous client
on a broker without the ACL, or a shared login): a bdseq far ahead of the node's own
never wins, and the node's own heartbeat stream always brings it back. Tracker level on a
real loop (deterministic), then end to end through a real Mosquitto and the consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from test_mqtt_consumer import FakeNode, Harness, new_client, wait_for

from central.membership.sessions import MAX_BDSEQ_AHEAD
from central.membership.tracker import MembershipTracker, NodeLiveness
from fleetwire.mqtt.payloads import Heartbeat, NodeStatus
from support.brokers import MosquittoBroker

ALIVE, SUSPECT, DEAD = NodeLiveness.ALIVE, NodeLiveness.SUSPECT, NodeLiveness.DEAD
HUGE = 10**15


def ms() -> int:
    return int(time.time() * 1000)


def hb(bdseq: int, seq: int, node_id: str = "a") -> Heartbeat:
    return Heartbeat(node_id=node_id, bdseq=bdseq, seq=seq, ts=ms(), interval_s=60)


def status(state: str, bdseq: int, ts: int | None = None) -> NodeStatus:
    return NodeStatus.model_validate({"state": state, "bdseq": bdseq, "ts": ms() if ts is None else ts})


@pytest.fixture
async def tracker() -> AsyncIterator[MembershipTracker]:
    t = MembershipTracker(suspect_after=2, dead_after=3, default_interval_s=60)
    yield t
    t.close()


def live_node(tracker: MembershipTracker, bdseq: int = 5) -> None:
    tracker.on_status("a", status("online", bdseq), retained=True)
    tracker.on_heartbeat("a", hb(bdseq, 0))
    assert tracker.state_of("a") is ALIVE


async def test_an_offline_far_ahead_of_the_nodes_bdseq_kills_nothing(tracker: MembershipTracker) -> None:
    live_node(tracker)
    tracker.on_status("a", status("offline", HUGE, ts=ms() + 10_000), retained=True)
    assert tracker.state_of("a") is ALIVE
    assert tracker.get("a").bdseq == 5  # type: ignore[union-attr]
    tracker.on_heartbeat("a", hb(5, 1))  # its own stream goes on, not stale
    assert tracker.counters.stale_heartbeats_ignored == 0
    # an offline one ahead is no better: only the current session's death counts
    tracker.on_status("a", status("offline", 6))
    assert tracker.state_of("a") is ALIVE
    assert tracker.counters.stale_deaths_ignored == 2
    tracker.on_status("a", status("offline", 5))  # its Last Will
    assert tracker.state_of("a") is DEAD
    assert [e.type for e in tracker.events()] == ["node_alive", "node_dead"]


async def test_a_forged_offline_read_at_start_up_yields_to_the_nodes_heartbeats(tracker: MembershipTracker) -> None:
    """What a restarted central reads first is the retained forgery; the node's own
    stream (two heartbeats in order) brings it back."""
    tracker.on_status("a", status("offline", HUGE, ts=ms() + 10_000), retained=True)
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb(5, 41))  # one heartbeat alone proves little
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb(5, 42))
    assert tracker.state_of("a") is ALIVE
    assert tracker.get("a").bdseq == 5  # type: ignore[union-attr]
    assert [(e.type, e.detail["reason"]) for e in tracker.events()] == [("node_rejoined", "heartbeat")]
    tracker.on_status("a", status("offline", 5))  # and its real death still counts
    assert tracker.state_of("a") is DEAD


async def test_a_forged_offline_with_the_current_bdseq_is_undone_by_the_next_heartbeats(
    tracker: MembershipTracker,
) -> None:
    """The current bdseq is no secret (the birth is retained): such an offline cannot be
    told from the node's own, but the stream that goes on after it can."""
    live_node(tracker)
    tracker.on_heartbeat("a", hb(5, 1))
    tracker.on_status("a", status("offline", 5), retained=True)
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb(5, 1))  # a straggler of the ended session changes nothing
    tracker.on_heartbeat("a", hb(5, 1))
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb(5, 2))
    assert tracker.state_of("a") is ALIVE
    assert [e.type for e in tracker.events()] == ["node_alive", "node_dead", "node_rejoined"]


async def test_a_birth_or_heartbeat_far_ahead_does_not_take_over_a_live_node(tracker: MembershipTracker) -> None:
    live_node(tracker)
    tracker.on_status("a", status("online", 5 + MAX_BDSEQ_AHEAD + 1, ts=ms() + 10_000), retained=True)
    tracker.on_heartbeat("a", hb(HUGE, 0))
    assert tracker.get("a").bdseq == 5  # type: ignore[union-attr]
    assert tracker.counters.bdseq_ahead_ignored == 2
    tracker.on_heartbeat("a", hb(5, 1))
    assert tracker.counters.stale_heartbeats_ignored == 0 and tracker.state_of("a") is ALIVE
    # a plausible step is a new session, as when the node reconnects
    tracker.on_status("a", status("online", 5 + MAX_BDSEQ_AHEAD))
    assert tracker.get("a").bdseq == 5 + MAX_BDSEQ_AHEAD  # type: ignore[union-attr]


async def test_a_forged_session_that_ended_gives_way_to_the_nodes_own_stream(tracker: MembershipTracker) -> None:
    """A plausible forged birth and its offline (bdseq 6) end the node's record; its own
    session 5 keeps beating and wins it back."""
    live_node(tracker)
    tracker.on_status("a", status("online", 6))
    tracker.on_status("a", status("offline", 6))
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb(5, 7))
    tracker.on_heartbeat("a", hb(5, 8))
    assert tracker.state_of("a") is ALIVE and tracker.get("a").bdseq == 5  # type: ignore[union-attr]


@pytest.mark.virtual_time  # the death by timeout takes no wall time
async def test_a_dead_node_comes_back_with_any_bdseq() -> None:
    """No bound once the node is dead: an edge that restarted many times without reaching
    the broker comes back with its birth."""
    tracker = MembershipTracker(suspect_after=1, dead_after=1, default_interval_s=0.05)
    try:
        live_node(tracker)
        tracker.on_status("a", status("offline", 5))
        tracker.on_status("a", status("online", 5 + 10 * MAX_BDSEQ_AHEAD))
        assert tracker.state_of("a") is ALIVE
        tracker.on_heartbeat("b", Heartbeat(node_id="b", bdseq=1, seq=0, ts=ms(), interval_s=0.05))
        deadline = time.monotonic() + 5
        while tracker.state_of("b") is not DEAD:  # dead by timeout
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        tracker.on_heartbeat("b", Heartbeat(node_id="b", bdseq=HUGE, seq=0, ts=ms(), interval_s=0.05))
        assert tracker.state_of("b") is ALIVE
    finally:
        tracker.close()


# ----------------------------------------------------------------- end to end


async def test_a_retained_forged_offline_neither_kills_a_beating_node_nor_keeps_it_dead_after_a_restart(
    mosquitto: MosquittoBroker,
) -> None:
    """An anonymous client on a broker without the ACL leaves a retained offline with a
    huge bdseq for a beating node: central keeps it alive, and a central started later
    (which reads the forgery first) sees it alive again from its heartbeats."""
    first = Harness(mosquitto)
    await first.consumer.start()
    second: Harness | None = None
    attacker = new_client("attacker")
    try:
        assert await first.consumer.wait_connected(10)
        node: FakeNode = await first.node("a", bdseq=3, interval_s=0.3)
        node.start_beating()
        await wait_for(lambda: first.tracker.state_of("a") is ALIVE, "a alive")
        attacker.connect(mosquitto.host, mosquitto.port, keepalive=10)
        attacker.loop_start()
        forged = status("offline", HUGE, ts=ms() + 60_000).model_dump_json()
        attacker.publish(node.topics.node_status("a"), forged, qos=1, retain=True).wait_for_publish(5)
        await wait_for(lambda: first.tracker.counters.stale_deaths_ignored == 1, "the forgery read and ignored")
        await asyncio.sleep(1.0)  # over three of its intervals
        assert [e.type for e in first.tracker.events() if e.node_id == "a"] == ["node_alive"]

        second = Harness(mosquitto)
        await second.consumer.start()
        assert await second.consumer.wait_connected(10)
        tracker = second.tracker
        await wait_for(lambda: tracker.state_of("a") is ALIVE, "a alive again at the restarted central")
        assert tracker.get("a").bdseq == 3  # type: ignore[union-attr]
        rejoined = [e for e in tracker.events() if e.node_id == "a"]
        assert [(e.type, e.detail["reason"]) for e in rejoined] == [("node_rejoined", "heartbeat")]
    finally:
        attacker.disconnect()
        attacker.loop_stop()
        for harness in (first, second):
            if harness is not None:
                await _close(harness)


async def _close(harness: Harness) -> None:
    for node in harness.nodes:
        await node.close()
    await harness.consumer.stop()
    harness.tracker.close()
