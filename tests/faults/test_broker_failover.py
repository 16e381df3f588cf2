"""Two brokers in ``broker.hosts``: an edge and central both on the first; it is SIGKILLed;
both move to the second, central never declares the edge dead and heartbeats go on there.
(Two independent Mosquittos share no retained state: the edge's birth and Last Will must be
registered again on the broker it lands on.)"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from central.membership.tracker import NodeLiveness
from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.settings import MqttSettings
from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.topics import Topics
from support.brokers import MosquittoBroker, retained

INTERVAL_S = 0.4  # dead after a few silent intervals: a failover slower than that shows


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[MosquittoBroker, MosquittoBroker]]:
    with MosquittoBroker() as first, MosquittoBroker() as second:
        yield first, second


async def test_edge_and_central_move_to_the_surviving_broker(
    pair: tuple[MosquittoBroker, MosquittoBroker], tmp_path: Path
) -> None:
    first, second = pair
    broker = BrokerSettings(
        hosts=[f"{first.host}:{first.port}", f"{second.host}:{second.port}"],
        keepalive_s=2,
        reconnect_min_s=0.1,
        reconnect_max_s=0.3,
    )
    mqtt_settings = MqttSettings(default_interval_s=INTERVAL_S)
    tracker = make_tracker(mqtt_settings)
    central = MembershipConsumer(mqtt_settings, tracker, broker=broker, central_id="c1")
    edge = HeartbeatPublisher(
        "n1", HeartbeatSettings(interval_s=INTERVAL_S, stop_timeout_s=1.0), HeartbeatBody, tmp_path, broker=broker
    )
    await central.start()
    await edge.start()
    try:
        await wait_for(lambda: tracker.state_of("n1") is NodeLiveness.ALIVE, "n1 alive")
        assert central.rotation.current == edge.rotation.current == (first.host, first.port)
        first_bdseq = edge.bdseq

        first.kill()
        on_second = (second.host, second.port)
        await wait_for(lambda: central.connected and central.rotation.current == on_second, "central on the second")
        await wait_for(lambda: edge.connected and edge.rotation.current == on_second, "edge on the second")
        # the edge announced itself again, on the broker it is now on, with the next bdseq
        assert edge.bdseq == first_bdseq + 1
        birth = retained(second, Topics().node_status("n1"))
        assert birth is not None and birth.json()["state"] == "online" and birth.json()["bdseq"] == edge.bdseq

        beats = tracker.counters.heartbeats_processed
        await wait_for(lambda: tracker.counters.heartbeats_processed >= beats + 5, "heartbeats via the second")
        assert tracker.state_of("n1") is NodeLiveness.ALIVE
        kinds = [e.type for e in tracker.events() if e.node_id == "n1"]
        assert "node_dead" not in kinds and "node_suspect" not in kinds, kinds
    finally:
        await edge.stop()
        await central.stop()
        tracker.close()
    # a clean stop on the second broker leaves "offline" retained there
    death = retained(second, Topics().node_status("n1"))
    assert death is not None and death.json()["state"] == "offline"


async def test_the_last_will_is_registered_on_the_broker_the_edge_moved_to(
    pair: tuple[MosquittoBroker, MosquittoBroker], tmp_path: Path
) -> None:
    first, second = pair
    broker = BrokerSettings(
        hosts=[f"{first.host}:{first.port}", f"{second.host}:{second.port}"],
        keepalive_s=1,
        reconnect_min_s=0.1,
        reconnect_max_s=0.3,
    )
    edge = HeartbeatPublisher(
        "n2", HeartbeatSettings(interval_s=INTERVAL_S, stop_timeout_s=1.0), HeartbeatBody, tmp_path, broker=broker
    )
    await edge.start()
    try:
        await wait_for(lambda: edge.connected, "edge on the first")
        first.kill()
        await wait_for(lambda: edge.connected and edge.rotation.current == (second.host, second.port), "edge moved")
        bdseq = edge.bdseq
        client = edge._client
        assert client is not None
        await asyncio.to_thread(client.loop_stop)  # no DISCONNECT, no reconnect: a crash
        sock = client.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        topic = Topics().node_status("n2")

        def dead() -> bool:
            msg = retained(second, topic)
            return msg is not None and msg.json()["state"] == "offline"

        await wait_for(dead, "the Last Will on the second broker")
        msg = retained(second, topic)
        assert msg is not None and msg.json()["bdseq"] == bdseq
    finally:
        await edge.stop()
