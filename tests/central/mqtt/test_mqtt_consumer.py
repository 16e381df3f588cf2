"""MembershipConsumer against a real mosquitto on a free port (never the system broker),
with real paho clients playing the edges."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from central.membership.tracker import MembershipTracker, NodeLiveness
from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.settings import MqttSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES, CentralStatus, Event, Heartbeat, NodeStatus
from fleetwire.mqtt.topics import Topics
from support.brokers import MosquittoBroker

pytestmark = pytest.mark.fleet  # a real Mosquitto, restarted and killed

REPO = Path(__file__).resolve().parents[3]
ALIVE, SUSPECT, DEAD = NodeLiveness.ALIVE, NodeLiveness.SUSPECT, NodeLiveness.DEAD


def ms() -> int:
    return int(time.time() * 1000)


def new_client(name: str) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{name}-{uuid.uuid4().hex[:8]}")
    client.reconnect_delay_set(0.1, 0.3)  # type: ignore[arg-type]
    return client


class FakeNode:
    """An edge's MQTT side: Last Will + retained birth, heartbeats at QoS 0."""

    def __init__(self, broker: MosquittoBroker, node_id: str, bdseq: int = 1, interval_s: float = 0.3) -> None:
        self.topics = Topics()
        self.node_id = node_id
        self.bdseq = bdseq
        self.interval_s = interval_s
        self.seq = 0
        self.connected = threading.Event()
        self.client = new_client(f"node-{node_id}")
        self.client.will_set(self.topics.node_status(node_id), self._status("offline"), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *a: self.connected.clear()
        self.client.connect_async(broker.host, broker.port, keepalive=5)
        self.client.loop_start()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def _status(self, state: str) -> str:
        return NodeStatus.model_validate({"state": state, "bdseq": self.bdseq, "ts": ms()}).model_dump_json()

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.publish(self.topics.node_status(self.node_id), self._status("online"), qos=1, retain=True)
        self.connected.set()

    async def ready(self) -> FakeNode:
        assert await asyncio.to_thread(self.connected.wait, 10), f"{self.node_id} did not connect"
        return self

    def beat(self) -> None:
        self.seq += 1
        beat = Heartbeat(
            node_id=self.node_id,
            bdseq=self.bdseq,
            seq=self.seq,
            ts=ms(),
            interval_s=self.interval_s,
            grpc_address=f"127.0.0.1:{60000 + self.seq % 10}",
        )
        self.client.publish(self.topics.node_heartbeat(self.node_id), beat.model_dump_json(), qos=0)

    def start_beating(self) -> None:
        async def run() -> None:
            while True:
                self.beat()
                await asyncio.sleep(self.interval_s / 3)

        self._task = asyncio.get_running_loop().create_task(run())

    async def stop_beating(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def publish_raw(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(5)

    async def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.stop_beating()
        self.client.disconnect()
        self.client.loop_stop()

    async def crash(self) -> None:
        """Vanish without DISCONNECT: the broker publishes the Last Will. (``loop_stop``
        first, so paho does not reconnect; it takes up to a second.)"""
        self._stopped = True
        await self.stop_beating()
        self.client.loop_stop()
        sock = self.client.socket()
        assert sock is not None
        sock.close()


class Watcher:
    """A plain subscriber collecting (topic, payload, retained) for assertions."""

    def __init__(self, broker: MosquittoBroker, topic: str) -> None:
        self.messages: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.client = new_client("watcher")
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_message = lambda _c, _u, m: self.messages.put((m.topic, bytes(m.payload), bool(m.retain)))
        self.client.connect_async(broker.host, broker.port, keepalive=5)
        self.client.loop_start()

    async def next(self, match: Callable[[bytes, bool], bool], timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no matching message"
            try:
                _topic, payload, retained = await asyncio.to_thread(self.messages.get, True, min(left, 0.5))
            except queue.Empty:
                continue
            if match(payload, retained):
                return payload

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def broker_settings(broker: MosquittoBroker) -> BrokerSettings:
    """Where ``broker`` listens, with quick reconnects."""
    return BrokerSettings(host=broker.host, port=broker.port, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=0.5)


class Harness:
    def __init__(self, broker: MosquittoBroker) -> None:
        self.broker = broker
        self.settings = MqttSettings(default_interval_s=0.3)
        self.tracker = make_tracker(self.settings)
        self.consumer = MembershipConsumer(
            self.settings, self.tracker, broker=broker_settings(broker), central_id="test-central"
        )
        self.nodes: list[FakeNode] = []
        self.watchers: list[Watcher] = []

    async def node(self, node_id: str, **kw: Any) -> FakeNode:
        node = FakeNode(self.broker, node_id, **kw)
        self.nodes.append(node)
        return await node.ready()

    def watch(self, topic: str) -> Watcher:
        w = Watcher(self.broker, topic)
        self.watchers.append(w)
        return w


@pytest.fixture
async def harness(mosquitto: MosquittoBroker) -> AsyncIterator[Harness]:
    h = Harness(mosquitto)
    await h.consumer.start()
    assert await h.consumer.wait_connected(10)
    yield h
    for node in h.nodes:
        await node.close()
    for w in h.watchers:
        w.close()
    await h.consumer.stop()
    h.tracker.close()


async def test_states_follow_births_heartbeats_and_deaths(harness: Harness) -> None:
    tracker = harness.tracker
    a = await harness.node("a", interval_s=3.0)  # long: its death must come from the Last Will
    b = await harness.node("b", interval_s=0.2)
    a.start_beating()
    b.start_beating()
    await wait_for(lambda: tracker.state_of("a") is ALIVE and tracker.state_of("b") is ALIVE, "a, b alive")
    await wait_for(lambda: getattr(tracker.get("a"), "last_heartbeat_at", None) is not None, "a heartbeat")
    assert getattr(tracker.get("a"), "grpc_address", "").startswith("127.0.0.1:")

    await b.stop_beating()  # silent but connected: timeouts
    await wait_for(lambda: tracker.state_of("b") is SUSPECT, "b suspect")
    await wait_for(lambda: tracker.state_of("b") is DEAD, "b dead")
    assert tracker.events()[-1].detail["reason"] == "heartbeat timeout"

    await a.crash()  # the broker publishes a's Last Will (same bdseq as its birth)
    await wait_for(lambda: tracker.state_of("a") is DEAD, "a dead by will", timeout=10)
    dead_a = [e for e in tracker.events() if e.node_id == "a" and e.type == "node_dead"]
    assert dead_a[-1].detail["reason"] == "last will"

    c = await harness.node("c", bdseq=3)
    await wait_for(lambda: tracker.state_of("c") is ALIVE, "c alive")
    c.publish_raw(c.topics.node_status("c"), NodeStatus(state="offline", bdseq=2, ts=ms()).model_dump_json().encode())
    # Stamped after any heartbeat c may still have in flight: a clean offline is stamped at
    # shutdown, and one no later than the session's last message reads as its Last Will.
    clean = NodeStatus(state="offline", bdseq=3, ts=ms() + 1000)
    c.publish_raw(c.topics.node_status("c"), clean.model_dump_json().encode())
    await wait_for(lambda: tracker.state_of("c") is DEAD, "c dead by clean offline")
    assert tracker.counters.stale_deaths_ignored == 1
    assert tracker.events()[-1].detail["reason"] == "clean shutdown"
    assert tracker.counters.malformed_dropped == 0


async def test_bad_messages_are_counted_and_dropped(harness: Harness) -> None:
    tracker = harness.tracker
    a = await harness.node("a", interval_s=60)
    a.beat()
    await wait_for(lambda: tracker.counters.heartbeats_processed == 1, "first heartbeat")
    before = tracker.get("a")
    t = a.topics
    good = Heartbeat(node_id="a", bdseq=1, seq=99, ts=ms(), interval_s=60).model_dump_json().encode()
    a.publish_raw(t.node_heartbeat("a"), b"{definitely not json")
    a.publish_raw(t.node_heartbeat("a"), json.dumps({"node_id": "a", "bdseq": "x"}).encode())
    a.publish_raw(t.node_status("a"), json.dumps({"state": "online"}).encode())
    a.publish_raw(t.node_heartbeat("someone-else"), good)  # topic id ≠ payload id
    a.publish_raw(t.node_heartbeat("a"), b"[" * (MAX_PAYLOAD_BYTES + 10))
    await wait_for(
        lambda: tracker.counters.malformed_dropped == 4 and tracker.counters.oversized_dropped == 1, "drop counters"
    )
    after = tracker.get("a")
    assert after is not None and before is not None
    assert after.last_heartbeat_at == before.last_heartbeat_at and after.state is ALIVE
    assert tracker.get("someone-else") is None
    assert tracker.counters.heartbeats_processed == 1
    # Still consuming.
    a.beat()
    await wait_for(lambda: tracker.counters.heartbeats_processed == 2, "heartbeat after the junk")
    assert harness.consumer.connects == 1


async def test_broker_restart_reconnects_resubscribes_and_kills_nobody(harness: Harness) -> None:
    tracker = harness.tracker
    a = await harness.node("a", interval_s=0.5)
    a.start_beating()
    await wait_for(lambda: tracker.state_of("a") is ALIVE, "a alive")
    harness.broker.kill()
    await wait_for(lambda: not harness.consumer.connected, "consumer noticed the outage")
    await asyncio.sleep(2.0)  # 4 intervals: a would be dead if timers ran without a link
    assert tracker.state_of("a") is ALIVE and not tracker.link_is_up
    harness.broker.start()
    await wait_for(lambda: harness.consumer.connects == 2, "consumer reconnected", timeout=10)
    b = await harness.node("b", interval_s=0.3)  # only seen if the consumer resubscribed
    b.beat()
    await wait_for(lambda: tracker.state_of("b") is ALIVE, "b after the restart")
    seq_before = tracker.counters.heartbeats_processed
    await wait_for(lambda: tracker.counters.heartbeats_processed > seq_before + 3, "a's heartbeats again")
    assert tracker.link_is_up
    assert [e.type for e in tracker.events() if e.node_id == "a"] == ["node_alive"]  # never suspect or dead
    await a.stop_beating()
    await wait_for(lambda: tracker.state_of("a") is DEAD, "timers run again after the reconnect")


async def test_central_status_and_events_are_published(harness: Harness) -> None:
    topics = Topics()
    status = harness.watch(topics.central_status)
    online = await status.next(lambda p, retained: bool(p) and json.loads(p)["state"] == "online")
    parsed = CentralStatus.model_validate_json(online)
    assert parsed.central_id == "test-central"

    events = harness.watch(topics.events)
    await asyncio.sleep(0.3)  # let the watcher subscribe
    await harness.node("ev", interval_s=60)
    raw = await events.next(lambda p, _r: json.loads(p).get("node_id") == "ev")
    event = Event.model_validate_json(raw)
    assert event.type == "node_alive" and event.detail["reason"] == "birth"

    await harness.consumer.stop()  # clean stop: offline, retained
    late = harness.watch(topics.central_status)  # a new subscriber gets the retained one
    offline = await late.next(lambda p, retained: retained)
    assert CentralStatus.model_validate_json(offline).state == "offline"


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from central.mqtt.consumer import MembershipConsumer, make_tracker
    from central.settings import MqttSettings
    from fleetwire.mqtt.broker import BrokerSettings

    async def main():
        b = BrokerSettings(port=int(sys.argv[1]), keepalive_s=2, reconnect_min_s=0.1, reconnect_max_s=0.5)
        s = MqttSettings()
        consumer = MembershipConsumer(s, make_tracker(s), broker=b, central_id="child-central")
        await consumer.start()
        assert await consumer.wait_connected(10)
        print("connected", flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)


async def test_sigkilled_central_goes_offline_by_last_will(mosquitto: MosquittoBroker) -> None:
    broker = mosquitto
    topics = Topics()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(broker.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    watcher = Watcher(broker, topics.central_status)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 15)
        assert line.strip() == b"connected", child.stderr.read() if child.stderr else b""

        def central(state: str) -> Callable[[bytes, bool], bool]:
            def match(p: bytes, _retained: bool) -> bool:
                s = CentralStatus.model_validate_json(p)
                return s.state == state and s.central_id == "child-central"

            return match

        await watcher.next(central("online"))
        child.send_signal(signal.SIGKILL)
        child.wait(5)
        await watcher.next(central("offline"), timeout=10)
    finally:
        watcher.close()
        if child.poll() is None:
            child.kill()
            child.wait(5)
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()


async def test_consumer_started_before_the_broker_connects_later() -> None:
    broker = MosquittoBroker()  # not started yet
    tracker = MembershipTracker(default_interval_s=0.3)
    consumer = MembershipConsumer(MqttSettings(), tracker, broker=broker_settings(broker))
    await consumer.start()
    try:
        await asyncio.sleep(0.5)
        assert not consumer.connected and not tracker.link_is_up
        broker.start()
        assert await consumer.wait_connected(10)
        await wait_for(lambda: tracker.link_is_up, "link up")
    finally:
        await consumer.stop()
        tracker.close()
        broker.close()


async def test_probes_measure_how_far_behind_its_feed_central_is(harness: Harness) -> None:
    probe = harness.consumer.probe
    await wait_for(lambda: probe.probes_returned >= 3, "probes back from the broker", timeout=10)
    assert probe.lag() < 0.5  # an idle loop reads its probes within milliseconds
    time.sleep(1.0)  # the loop stalls: nothing is read, whatever the broker holds for us
    assert probe.lag() >= 0.7
    await wait_for(lambda: probe.lag() < 0.5, "caught up again", timeout=10)
