"""MembershipTracker on a real asyncio loop with small intervals; no network.

The loop's clock is virtual (``virtual_time``, conftest's ``VirtualTimeLoop``): the
tracker's timers fire as they would, but the loop jumps over idle time instead of
sleeping through it, so silences take no wall time and a busy machine cannot make a
heartbeat late."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from central.membership.tracker import MembershipTracker, NodeLiveness, TransitionInfo
from central.mqtt.consumer import MembershipConsumer
from central.settings import MqttSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES, Event, Heartbeat, ModelInfo, NodeStatus
from fleetwire.mqtt.topics import Topics

pytestmark = pytest.mark.virtual_time

ALIVE, SUSPECT, DEAD = NodeLiveness.ALIVE, NodeLiveness.SUSPECT, NodeLiveness.DEAD
TOPICS = Topics()


def ms() -> int:
    return int(time.time() * 1000)


def hb(node_id: str, bdseq: int = 1, interval_s: float = 0.1, seq: int = 0, **kw: Any) -> Heartbeat:
    kw.setdefault("grpc_address", f"127.0.0.1:{5000 + hash(node_id) % 1000}")
    kw.setdefault("http_address", "127.0.0.1:8000")
    return Heartbeat(node_id=node_id, bdseq=bdseq, seq=seq, ts=ms(), interval_s=interval_s, **kw)


def birth(bdseq: int, ts: int | None = None) -> NodeStatus:
    return NodeStatus(state="online", bdseq=bdseq, ts=ms() if ts is None else ts)


def death(bdseq: int, ts: int | None = None) -> NodeStatus:
    return NodeStatus(state="offline", bdseq=bdseq, ts=ms() if ts is None else ts)


class Recorder:
    """Collects listener calls."""

    def __init__(self, tracker: MembershipTracker) -> None:
        self.calls: list[tuple[str, NodeLiveness | None, NodeLiveness, TransitionInfo]] = []
        tracker.subscribe(self)

    def __call__(self, node_id: str, old: NodeLiveness | None, new: NodeLiveness, info: TransitionInfo) -> None:
        self.calls.append((node_id, old, new, info))

    def transitions(self, node_id: str) -> list[tuple[NodeLiveness | None, NodeLiveness, str]]:
        return [(o, n, i.reason) for nid, o, n, i in self.calls if nid == node_id and o != n]


async def wait_state(tracker: MembershipTracker, node_id: str, state: NodeLiveness, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while tracker.state_of(node_id) is not state:
        assert time.monotonic() < deadline, f"{node_id} never became {state}: {tracker.get(node_id)}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def tracker() -> Any:
    t = MembershipTracker(suspect_after=2, dead_after=3, default_interval_s=0.1)
    yield t
    t.close()


async def test_silence_goes_alive_suspect_dead(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    start = asyncio.get_running_loop().time()
    tracker.on_heartbeat("a", hb("a"))
    assert tracker.state_of("a") is ALIVE
    await wait_state(tracker, "a", SUSPECT)
    suspect_at = asyncio.get_running_loop().time()
    await wait_state(tracker, "a", DEAD)
    dead_at = asyncio.get_running_loop().time()
    # Never early (the timer may be up to 1 ms early by the loop's clock resolution).
    assert suspect_at - start >= 0.2 - 0.002
    assert dead_at - start >= 0.3 - 0.002
    assert rec.transitions("a") == [
        (None, ALIVE, "heartbeat"),
        (ALIVE, SUSPECT, "heartbeat timeout"),
        (SUSPECT, DEAD, "heartbeat timeout"),
    ]
    types = [e.type for e in tracker.events()]
    assert types == ["node_alive", "node_suspect", "node_dead"]
    dead_event = tracker.events()[-1]
    assert dead_event.node_id == "a" and dead_event.detail["reason"] == "heartbeat timeout"
    assert dead_event.detail["silent_s"] >= 0.29
    view = tracker.get("a")
    assert view is not None and view.state is DEAD and view.last_heartbeat_age_s is not None
    assert view.last_heartbeat_age_s >= 0.3 - 0.002


async def test_heartbeats_before_the_deadline_keep_a_node_alive(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    for seq in range(25):  # 1.25 s of beats every 50 ms, declared interval 200 ms
        tracker.on_heartbeat("a", hb("a", interval_s=0.2, seq=seq))
        await asyncio.sleep(0.05)
    assert tracker.state_of("a") is ALIVE
    assert rec.transitions("a") == [(None, ALIVE, "heartbeat")]
    assert tracker.counters.heartbeats_processed == 25


async def test_suspect_node_that_beats_again_is_alive(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    tracker.on_heartbeat("a", hb("a"))
    await wait_state(tracker, "a", SUSPECT)
    tracker.on_heartbeat("a", hb("a", seq=1))
    assert tracker.state_of("a") is ALIVE
    assert rec.transitions("a")[-1] == (SUSPECT, ALIVE, "heartbeat")
    assert tracker.events()[-1].type == "node_alive"
    await wait_state(tracker, "a", DEAD)  # and the timers still run afterwards


async def test_offline_with_the_births_bdseq_is_dead_at_once(tracker: MembershipTracker) -> None:
    t0 = ms()
    tracker.on_status("a", birth(4, ts=t0))
    tracker.on_heartbeat("a", hb("a", bdseq=4, interval_s=60))
    # A Last Will is composed at connect time: stamped before the birth and heartbeats.
    tracker.on_status("a", death(4, ts=t0 - 5))
    assert tracker.state_of("a") is DEAD
    assert tracker.events()[-1].type == "node_dead"
    assert tracker.events()[-1].detail["reason"] == "last will"
    # A clean shutdown is stamped when it happens.
    tracker.on_status("b", birth(1, ts=t0))
    tracker.on_status("b", death(1, ts=t0 + 1000))
    assert tracker.state_of("b") is DEAD
    assert tracker.events()[-1].detail["reason"] == "clean shutdown"
    # A late heartbeat of the ended session does not resurrect it.
    tracker.on_heartbeat("a", hb("a", bdseq=4, interval_s=60))
    assert tracker.state_of("a") is DEAD
    assert tracker.counters.stale_heartbeats_ignored == 1


async def test_stale_death_of_a_superseded_session_is_ignored(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    tracker.on_status("a", birth(1))
    tracker.on_status("a", birth(2))  # reconnected before the broker noticed session 1 died
    tracker.on_status("a", death(1))  # session 1's Last Will arrives late
    assert tracker.state_of("a") is ALIVE
    assert tracker.counters.stale_deaths_ignored == 1
    assert tracker.get("a").bdseq == 2  # type: ignore[union-attr]
    assert rec.transitions("a") == [(None, ALIVE, "birth")]
    tracker.on_status("a", death(2))
    assert tracker.state_of("a") is DEAD


async def test_new_birth_after_death_rejoins(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    tracker.on_status("a", birth(1))
    tracker.on_status("a", death(1))
    tracker.on_status("a", birth(1))  # the same birth again (retained redelivery): no news
    assert tracker.state_of("a") is DEAD
    tracker.on_status("a", birth(2), retained=False)
    assert tracker.state_of("a") is ALIVE
    assert rec.transitions("a")[-1] == (DEAD, ALIVE, "birth")
    assert tracker.events()[-1].type == "node_rejoined"
    assert [e.type for e in tracker.events()] == ["node_alive", "node_dead", "node_rejoined"]


async def test_heartbeat_after_a_timeout_death_rejoins(tracker: MembershipTracker) -> None:
    tracker.on_heartbeat("a", hb("a", bdseq=3))
    await wait_state(tracker, "a", DEAD)
    tracker.on_heartbeat("a", hb("a", bdseq=2))  # older session: ignored
    assert tracker.state_of("a") is DEAD
    tracker.on_heartbeat("a", hb("a", bdseq=3, seq=9))  # same session, was only cut off
    assert tracker.state_of("a") is ALIVE
    assert tracker.events()[-1].type == "node_rejoined"
    assert tracker.events()[-1].detail["reason"] == "heartbeat"


async def test_bdseq_reset_by_a_restarted_node_is_a_new_session(tracker: MembershipTracker) -> None:
    t0 = ms()
    tracker.on_status("a", birth(7, ts=t0))
    tracker.on_status("a", death(7, ts=t0 + 10))
    tracker.on_status("a", birth(0, ts=t0 - 100))  # older than the last birth: stale
    assert tracker.state_of("a") is DEAD
    assert tracker.counters.stale_births_ignored == 1
    tracker.on_status("a", birth(0, ts=t0 + 5000))  # later birth, counter reset to 0
    assert tracker.state_of("a") is ALIVE
    assert tracker.counters.bdseq_resets == 1
    tracker.on_status("a", death(7, ts=t0))  # session 7's will again: older than this birth
    assert tracker.state_of("a") is ALIVE
    tracker.on_heartbeat("a", hb("a", bdseq=0, interval_s=60))
    assert tracker.state_of("a") is ALIVE


async def test_retained_offline_of_an_unknown_node_is_recorded_quietly(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    tracker.on_status("gone", death(5), retained=True)
    assert tracker.state_of("gone") is DEAD
    assert rec.calls == [] and tracker.events() == []
    tracker.on_heartbeat("gone", hb("gone", bdseq=6))
    assert tracker.state_of("gone") is ALIVE
    assert tracker.forget("gone") is False  # only dead nodes can be forgotten
    tracker.on_status("gone", death(6))
    assert tracker.forget("gone") is True and tracker.get("gone") is None


async def test_startup_grace_and_frozen_link() -> None:
    tracker = MembershipTracker(default_interval_s=0.1)
    try:
        rec = Recorder(tracker)
        tracker.link_down()  # the consumer has not connected yet
        tracker.on_status("a", birth(1), retained=True)
        tracker.on_heartbeat("b", hb("b"))
        await asyncio.sleep(0.5)  # well past both windows: nothing moves without a link
        assert tracker.state_of("a") is ALIVE and tracker.state_of("b") is ALIVE
        up = asyncio.get_running_loop().time()
        tracker.link_up()
        await wait_state(tracker, "a", DEAD)
        await wait_state(tracker, "b", DEAD)
        now = asyncio.get_running_loop().time()
        assert now - up >= 0.3 - 0.002  # a full dead window after the link came up
        assert rec.transitions("a")[0] == (None, ALIVE, "birth")
        assert tracker.events()[0].detail.get("retained") is True
    finally:
        tracker.close()


async def test_a_retained_birth_with_a_fresh_heartbeat_is_never_declared_dead() -> None:
    tracker = MembershipTracker(default_interval_s=0.1)
    try:
        rec = Recorder(tracker)
        tracker.on_status("a", birth(1), retained=True)
        for seq in range(10):
            await asyncio.sleep(0.1)
            tracker.on_heartbeat("a", hb("a", interval_s=0.5, seq=seq))
        assert rec.transitions("a") == [(None, ALIVE, "birth")]
    finally:
        tracker.close()


async def test_shorter_declared_interval_rearms_earlier(tracker: MembershipTracker) -> None:
    tracker.on_heartbeat("a", hb("a", interval_s=30))
    tracker.on_heartbeat("a", hb("a", interval_s=0.05, seq=1))
    await wait_state(tracker, "a", DEAD, timeout=2.0)


async def test_ready_nodes_and_views(tracker: MembershipTracker) -> None:
    ready = ModelInfo(name="m", version="1", state="ready")
    tracker.on_heartbeat("a", hb("a", interval_s=60, models=[ready]))
    tracker.on_heartbeat("b", hb("b", interval_s=60, models=[ModelInfo(name="m", version="2", state="ready")]))
    tracker.on_heartbeat("c", hb("c", interval_s=60, models=[ModelInfo(name="m", version="1", state="loading")]))
    tracker.on_heartbeat("d", hb("d", interval_s=60, models=[ready]))
    tracker.on_status("d", death(1))
    assert [v.node_id for v in tracker.ready_nodes("m")] == ["a", "b"]
    assert [v.node_id for v in tracker.ready_nodes("m", "1")] == ["a"]
    assert tracker.ready_nodes("other") == []
    views = tracker.nodes()
    assert [v.node_id for v in views] == ["a", "b", "c", "d"]
    a = views[0]
    assert a.models == [ready] and a.interval_s == 60 and a.grpc_address and a.load is not None
    assert a.last_heartbeat_at is not None and a.reported_state == "online"
    assert tracker.counts() == {"alive": 3, "suspect": 0, "dead": 1}


async def test_ready_index_follows_model_changes(tracker: MembershipTracker) -> None:
    def models(*specs: tuple[str, str, str]) -> list[ModelInfo]:
        return [ModelInfo(name=n, version=v, state=st) for n, v, st in specs]

    tracker.on_heartbeat("a", hb("a", interval_s=60, models=models(("m", "1", "loading")), http_address="h-a:1"))
    assert tracker.ready_endpoints("m") == []
    tracker.on_heartbeat("a", hb("a", interval_s=60, models=models(("m", "1", "ready")), http_address="h-a:1"))
    tracker.on_heartbeat("b", hb("b", interval_s=60, models=models(("m", "2", "ready")), http_address="h-b:1"))
    assert sorted(tracker.ready_endpoints("m")) == [("a", "h-a:1"), ("b", "h-b:1")]
    assert tracker.ready_endpoints("m", "2") == [("b", "h-b:1")]
    tracker.on_heartbeat("a", hb("a", interval_s=60, models=models(("m", "2", "ready")), http_address="h-a:1"))
    assert tracker.ready_endpoints("m", "1") == []
    assert sorted(tracker.ready_endpoints("m", "2")) == [("a", "h-a:1"), ("b", "h-b:1")]
    tracker.on_status("b", death(1))  # dead nodes are not candidates, though still indexed
    assert tracker.ready_endpoints("m", "2") == [("a", "h-a:1")]
    tracker.on_heartbeat("b", hb("b", bdseq=2, interval_s=60, models=models(("m", "2", "ready")), http_address="h-b:1"))
    assert len(tracker.ready_endpoints("m", "2")) == 2
    tracker.on_heartbeat("a", hb("a", interval_s=60, models=[]))
    tracker.on_status("b", death(2))
    assert tracker.forget("b")
    assert tracker.ready_endpoints("m") == [] and tracker._ready_index == {}


async def test_address_change_is_notified_without_an_event(tracker: MembershipTracker) -> None:
    rec = Recorder(tracker)
    tracker.on_status("a", birth(1))  # a birth carries no addresses
    tracker.on_heartbeat("a", hb("a", interval_s=60, grpc_address="10.0.0.1:7000"))
    tracker.on_heartbeat("a", hb("a", interval_s=60, grpc_address="10.0.0.1:7000", seq=1))
    same = [(o, n, i) for _, o, n, i in rec.calls if o == n]
    assert len(same) == 1
    assert same[0][2].reason == "addresses changed" and same[0][2].event is None
    assert same[0][2].view.grpc_address == "10.0.0.1:7000"
    assert len(tracker.events()) == 1


async def test_events_ring_is_bounded_and_published() -> None:
    published: list[Event] = []
    tracker = MembershipTracker(events_kept=10, publisher=published.append)
    try:
        for i in range(15):
            tracker.on_status(f"n{i}", birth(1))
            tracker.on_status(f"n{i}", death(1))
        assert len(published) == 30
        kept = tracker.events()
        assert len(kept) == 10 and kept == published[-10:]
        assert tracker.events(3) == published[-3:]
        assert tracker.events(0) == []
    finally:
        tracker.close()


async def test_failing_listener_and_publisher_do_not_break_the_tracker() -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("listener bug")

    tracker = MembershipTracker(publisher=boom)
    try:
        tracker.subscribe(boom)
        rec = Recorder(tracker)
        tracker.on_status("a", birth(1))
        tracker.on_status("a", death(1))
        assert tracker.state_of("a") is DEAD and len(rec.calls) == 2
    finally:
        tracker.close()


async def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        MembershipTracker(suspect_after=3, dead_after=2)
    with pytest.raises(ValueError):
        MqttSettings(suspect_after=4, dead_after=3)
    with pytest.raises(ValueError, match="reconnect_min_s must not exceed"):
        BrokerSettings(reconnect_min_s=5, reconnect_max_s=1)


async def drained() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_malformed_messages_are_counted_on_the_consumer_path(tracker: MembershipTracker) -> None:
    consumer = MembershipConsumer(MqttSettings(), tracker, asyncio.get_running_loop())
    good = hb("a", interval_s=60).model_dump_json().encode()
    consumer.handle_message(TOPICS.node_heartbeat("a"), good)
    await drained()
    assert tracker.state_of("a") is ALIVE
    before = tracker.get("a")

    consumer.handle_message(TOPICS.node_heartbeat("a"), b"{not json")
    consumer.handle_message(TOPICS.node_heartbeat("a"), b'{"node_id": "a", "bdseq": -1}')  # wrong schema
    consumer.handle_message(TOPICS.node_heartbeat("b"), good)  # topic says b, payload says a
    consumer.handle_message(TOPICS.node_status("a"), b'{"state": "sleeping", "bdseq": 1, "ts": 1}')
    consumer.handle_message(TOPICS.node_status("a"), "\udcff".encode("utf-8", "surrogatepass"))  # bad utf-8
    consumer.handle_message("modelfleet/v1/nodes/a/other", good)
    consumer.handle_message("elsewhere/nodes/a/heartbeat", good)
    consumer.handle_message(TOPICS.node_status("a"), b"")  # a retained status being cleared: ignored
    consumer.handle_message(TOPICS.node_heartbeat("a"), b" " * (MAX_PAYLOAD_BYTES + 1))
    await drained()
    assert tracker.counters.malformed_dropped == 7
    assert tracker.counters.oversized_dropped == 1
    assert tracker.counters.heartbeats_processed == 1 and tracker.counters.statuses_processed == 0
    assert tracker.get("b") is None
    after = tracker.get("a")
    assert after is not None and before is not None
    assert after.state is ALIVE and after.last_heartbeat_at == before.last_heartbeat_at

    consumer.handle_message(TOPICS.node_status("a"), death(1).model_dump_json().encode(), True)
    await drained()
    assert tracker.state_of("a") is DEAD


async def test_ten_thousand_nodes_exact_deaths() -> None:
    """10,000 nodes beating every 100 ms (declared interval 0.5 s): no false deaths (nobody
    even suspect); exactly the 1 % that go silent die."""
    n = 10_000
    tracker = MembershipTracker(suspect_after=2, dead_after=3)
    try:
        rec = Recorder(tracker)
        ids = [f"edge-{i:05d}" for i in range(n)]
        beats = {node_id: hb(node_id, interval_s=0.5) for node_id in ids}
        silent = set(ids[::100])
        assert len(silent) == 100
        for node_id, beat in beats.items():  # first sight of everyone (the slow pass: events)
            tracker.on_heartbeat(node_id, beat)
        loop = asyncio.get_running_loop()
        start = loop.time()
        settled_at: float | None = None
        while True:
            for node_id, beat in beats.items():
                if node_id not in silent:
                    tracker.on_heartbeat(node_id, beat)
            await asyncio.sleep(0.1)
            now = loop.time()
            if settled_at is None and tracker.counts()["dead"] >= len(silent):
                settled_at = now
            if settled_at is not None and now - settled_at > 0.5:
                break
            assert now - start < 10, tracker.counts()
        dead = {v.node_id for v in tracker.nodes() if v.state is DEAD}
        assert dead == silent
        assert tracker.counts() == {"alive": n - 100, "suspect": 0, "dead": 100}
        moved = {nid for nid, old, new, _ in rec.calls if old is not None and old != new}
        assert moved == silent  # nobody else ever even went suspect
        assert len(tracker.events()) == 500  # the ring keeps the last 500 of 10,200
        assert tracker.counters.transitions == n + 200
    finally:
        tracker.close()


def test_built_outside_a_loop_binds_to_the_first_one() -> None:
    tracker = MembershipTracker(default_interval_s=0.05)  # like Central.__init__, no loop yet

    async def use() -> None:
        tracker.on_status("a", birth(1))
        await wait_state(tracker, "a", DEAD)

    asyncio.run(use())
    tracker.close()


async def test_disabled_consumer_does_not_connect(tracker: MembershipTracker) -> None:
    consumer = MembershipConsumer(MqttSettings(enabled=False), tracker)
    await consumer.start()
    assert not consumer.connected and consumer._client is None
    await consumer.stop()


async def test_no_node_is_convicted_for_a_silence_that_may_be_centrals_own_backlog(
    tracker: MembershipTracker,
) -> None:
    """While central is behind its feed (lag from its probes), a quiet node may have beaten
    and the beat be waiting in central's queue: it stays alive until central catches up."""
    lag = {"s": 10.0}
    tracker.set_lag_source(lambda: lag["s"])
    tracker.on_heartbeat("a", hb("a", interval_s=0.05))
    await asyncio.sleep(0.5)  # 10 intervals of silence, but 10 s of unread feed
    assert tracker.state_of("a") is ALIVE
    lag["s"] = 0.0  # caught up, and still nothing from "a"
    await wait_state(tracker, "a", DEAD, timeout=5)


async def test_a_heartbeat_read_late_counts_from_when_it_was_sent(tracker: MembershipTracker) -> None:
    lag = {"s": 0.3}
    tracker.set_lag_source(lambda: lag["s"])
    tracker.on_heartbeat("a", hb("a", interval_s=60))
    view = tracker.get("a")
    assert view is not None and view.last_heartbeat_age_s is not None
    assert view.last_heartbeat_age_s >= 0.3  # its age includes the time it spent queued
