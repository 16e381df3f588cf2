"""Under a replicated central (``ha.replica_id`` set) the Register reply names a heartbeat
partition: the edge moves its heartbeats, its retained birth and its Last Will to
``<prefix>/p/<n>/nodes/<id>/…`` and clears the birth it left on the unpartitioned topic. It
keeps the partition on disk, so a restart while no replica answers publishes there too."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from central.server import CentralServer
from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.server import EdgeServer
from edge_node.settings import EdgeSettings, HeartbeatSettings
from edge_node.sync.saved_partition import PARTITION_FILE
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.topics import Topics, partition_of
from support.brokers import Message, MosquittoBroker, Subscriber, close_wakeup_pair, retained
from support.fleet import central_settings, edge_settings
from support.wait import wait_for

pytestmark = pytest.mark.fleet  # Mosquitto and PostgreSQL

REPO = Path(__file__).resolve().parents[3]
ACL = REPO / "deploy" / "mosquitto" / "acl"
PARTITIONS = 8
NODE = "edge-0"
PLAIN = Topics()
PARTITIONED = Topics(partition=partition_of(NODE, PARTITIONS))


@pytest.fixture
async def replica(tmp_path: Path, postgres_url: str) -> AsyncIterator[CentralServer]:
    """One replica of a replicated central (its heartbeat consumer is not what is tested here)."""
    settings = central_settings(
        tmp_path / "central", store={"url": postgres_url}, ha={"replica_id": "r1", "partitions": PARTITIONS}
    )
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def edge(tmp_path: Path, replica: CentralServer, mosquitto: MosquittoBroker) -> AsyncIterator[EdgeServer]:
    """An edge heartbeating every 0.2 s to ``mosquitto``; the broker sends its will ~3 s after it goes silent."""
    server = EdgeServer(_edge_settings(tmp_path, replica.grpc_address, mosquitto))
    yield server
    await server.stop()


@pytest.fixture
async def publisher(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[HeartbeatPublisher]:
    """A bare publisher for ``NODE`` on ``mosquitto`` (unpartitioned until told), stopped after."""
    made = HeartbeatPublisher(
        NODE,
        HeartbeatSettings(interval_s=0.2, stop_timeout_s=1.0),
        HeartbeatBody,
        tmp_path,
        broker=BrokerSettings(port=mosquitto.port, keepalive_s=2, reconnect_min_s=0.1, reconnect_max_s=0.3),
    )
    yield made
    await made.stop()


def _status_of(message: Message) -> tuple[str, int]:
    body = json.loads(message.payload)
    return body["state"], body["bdseq"]


def _edge_settings(tmp_path: Path, central: str, mosquitto: MosquittoBroker) -> EdgeSettings:
    return edge_settings(
        NODE,
        central,
        tmp_path / NODE,
        heartbeat={"enabled": True, "interval_s": 0.2, "stop_timeout_s": 1.0},
        broker={"port": mosquitto.port, "keepalive_s": 2, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3},
    )


def _drop_connection(publisher: HeartbeatPublisher) -> None:
    """Break the MQTT connection without DISCONNECT, so the broker publishes the will."""
    client = publisher._client
    assert client is not None
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)


async def test_a_stop_during_a_switch_leaves_no_birth_retained_on_the_old_topic(
    mosquitto: MosquittoBroker, publisher: HeartbeatPublisher
) -> None:
    # The switch's DISCONNECT discards the old will, and a stop ends the switch before it
    # reconnects: the old birth must be cleared on the old connection, or it stays "online".
    await publisher.start()
    assert await publisher.wait_connected(5)
    assert retained(mosquitto, PLAIN.node_status(NODE)) is not None
    publisher.use_partition(PARTITIONED.partition)
    await publisher.stop()
    assert retained(mosquitto, PLAIN.node_status(NODE)) is None


async def test_a_connected_publisher_switches_its_birth_will_and_beats_to_a_partition(
    mosquitto: MosquittoBroker, publisher: HeartbeatPublisher
) -> None:
    topics = [PLAIN.node_status(NODE), PLAIN.node_heartbeat(NODE), PARTITIONED.all_status, PARTITIONED.all_heartbeats]
    with Subscriber(mosquitto, topics) as sub:
        await publisher.start()
        assert await publisher.wait_connected(5)
        await sub.async_wait_topic(PLAIN.node_heartbeat(NODE))
        publisher.use_partition(None)  # what a single central answers: nothing changes
        assert publisher.partition is None and publisher._switch_task is None

        publisher.use_partition(PARTITIONED.partition)
        birth = await sub.async_wait_topic(PARTITIONED.node_status(NODE))
        assert _status_of(birth[0]) == ("online", 2)  # a new connection, so a new bdseq
        await sub.async_wait_topic(PARTITIONED.node_heartbeat(NODE), count=3)
        assert retained(mosquitto, PLAIN.node_status(NODE)) is None  # its old birth cleared
        plain = [(m.topic, m.payload) for m in sub.messages if m.topic == PLAIN.node_status(NODE)]
        assert plain[0][1] and _status_of(sub.on(PLAIN.node_status(NODE))[0]) == ("online", 1)
        assert plain[1:] and all(not p for _, p in plain[1:]), "a clean switch: no offline on the old topic"
        publisher.use_partition(PARTITIONED.partition)  # a later Register says the same: no reconnect
        assert publisher.connects == 2

        seen = len(sub.messages)
        _drop_connection(publisher)
        await sub.async_wait_for(
            lambda m: m.topic == PARTITIONED.node_status(NODE) and _status_of(m) == ("offline", 2), start=seen
        )
        await publisher.stop()
    assert retained(mosquitto, PARTITIONED.node_status(NODE)) is not None


async def test_heartbeats_birth_and_will_go_to_the_partition_central_names(
    mosquitto: MosquittoBroker, edge: EdgeServer
) -> None:
    topics = [PLAIN.all_status, PLAIN.all_heartbeats, PARTITIONED.all_status, PARTITIONED.all_heartbeats]
    with Subscriber(mosquitto, topics) as sub:
        await edge.start()
        await wait_for(lambda: edge.edge.follower.partition == PARTITIONED.partition, what="the Register reply")
        births = await sub.async_wait_for(
            lambda m: m.topic == PARTITIONED.node_status(NODE) and _status_of(m)[0] == "online", timeout=10
        )
        bdseq = _status_of(births[0])[1]
        seen = len(sub.messages)
        await sub.async_wait_topic(PARTITIONED.node_heartbeat(NODE), count=5, start=seen, timeout=10)

        # the birth it may have sent before central answered is gone from the plain topic,
        # and from the switch on nothing but that clearing went there
        assert retained(mosquitto, PLAIN.node_status(NODE)) is None
        plain = [m for m in sub.messages[seen:] if m.topic.startswith(f"{PLAIN.prefix}/nodes/")]
        assert all(m.topic == PLAIN.node_status(NODE) and m.payload == b"" for m in plain), plain
        beats = [json.loads(m.payload) for m in sub.on(PARTITIONED.node_heartbeat(NODE))]
        assert {b["bdseq"] for b in beats} == {bdseq} and beats[-1]["node_id"] == NODE

        async with httpx.AsyncClient(base_url=edge.http_url, timeout=10) as client:
            central = (await client.get("/api/v1/status")).json()["central"]
        assert central["heartbeat_partition"] == PARTITIONED.partition

        # the connection breaks without DISCONNECT: the broker publishes the will, on the partition
        seen = len(sub.messages)
        client_ = edge.edge.heartbeat._client
        assert client_ is not None
        sock = client_.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)
        wills = await sub.async_wait_for(
            lambda m: m.topic == PARTITIONED.node_status(NODE) and _status_of(m) == ("offline", bdseq),
            start=seen,
            timeout=10,
        )
        assert wills
        await sub.async_wait_for(
            lambda m: m.topic == PARTITIONED.node_status(NODE) and _status_of(m) == ("online", bdseq + 1),
            start=seen,
            timeout=10,
        )
        after = [m for m in sub.messages[seen:] if m.topic.startswith(f"{PLAIN.prefix}/nodes/")]
        assert all(m.payload == b"" for m in after), after


async def test_an_edge_restarted_while_no_replica_answers_publishes_on_its_kept_partition(
    tmp_path: Path, postgres_url: str, mosquitto: MosquittoBroker
) -> None:
    settings = central_settings(
        tmp_path / "central", store={"url": postgres_url}, ha={"replica_id": "r1", "partitions": PARTITIONS}
    )
    replica = CentralServer(settings)
    await replica.start()
    try:
        first = EdgeServer(_edge_settings(tmp_path, replica.grpc_address, mosquitto))
        await first.start()
        try:
            await wait_for(lambda: first.edge.follower.partition == PARTITIONED.partition, what="the Register reply")
        finally:
            await first.stop()
    finally:
        await replica.stop()
    kept = json.loads((tmp_path / NODE / PARTITION_FILE).read_text())
    assert kept == {"partitions": PARTITIONS, "partition": PARTITIONED.partition}

    # Cold boot with every replica down: nobody answers Register, the kept partition holds.
    topics = [PLAIN.all_status, PLAIN.all_heartbeats, PARTITIONED.all_status, PARTITIONED.all_heartbeats]
    with Subscriber(mosquitto, topics) as sub:
        seen = len(sub.messages)  # the retained offline the first run left on the partition
        second = EdgeServer(_edge_settings(tmp_path, replica.grpc_address, mosquitto))
        await second.start()
        try:
            await sub.async_wait_for(
                lambda m: m.topic == PARTITIONED.node_status(NODE) and _status_of(m)[0] == "online",
                start=seen,
                timeout=10,
            )
            await sub.async_wait_topic(PARTITIONED.node_heartbeat(NODE), count=3, start=seen, timeout=10)
            assert not second.edge.follower.connected.is_set()  # no replica ever answered
        finally:
            await second.stop(unregister=False)  # no central to tell
    plain = [m for m in sub.messages[seen:] if m.topic.startswith(f"{PLAIN.prefix}/nodes/") and m.payload]
    assert plain == [], "nothing but clearings on the plain topics"


async def test_the_shipped_acl_lets_an_edge_publish_in_its_partition_and_only_as_itself(
    tmp_path: Path,
) -> None:
    users = {NODE: "e0-secret", "edge-1": "e1-secret", "dashboard": "dash-secret"}
    acl = ACL.read_text() + "\nuser dashboard\ntopic read modelfleet/v1/#\n"
    with MosquittoBroker(users=users, acl=acl) as broker:
        link = BrokerSettings(
            port=broker.port, reconnect_min_s=0.1, reconnect_max_s=0.3, username=NODE, password=users[NODE]
        )
        settings = HeartbeatSettings(interval_s=0.2, stop_timeout_s=1.0)
        own = HeartbeatPublisher(NODE, settings, HeartbeatBody, tmp_path, broker=link)
        with Subscriber(broker, f"{PLAIN.prefix}/#", username="dashboard", password=users["dashboard"]) as sub:
            own.use_partition(PARTITIONED.partition)
            await own.start()
            try:
                await sub.async_wait_topic(PARTITIONED.node_status(NODE))
                await sub.async_wait_topic(PARTITIONED.node_heartbeat(NODE), count=3)
            finally:
                await own.stop()
            await sub.async_wait_for(
                lambda m: m.topic == PARTITIONED.node_status(NODE) and m.json()["state"] == "offline"
            )
            # edge-1 writes into edge-0's partitioned topics, then into its own: only its own arrives
            other = Topics(partition=partition_of("edge-1", PARTITIONS))
            seen = len(sub.messages)
            await asyncio.to_thread(
                _publish_as,
                broker,
                "edge-1",
                users["edge-1"],
                [PARTITIONED.node_status(NODE), PARTITIONED.node_heartbeat(NODE), other.node_heartbeat("edge-1")],
            )
            await sub.async_wait_topic(other.node_heartbeat("edge-1"), start=seen)
            assert [m.topic for m in sub.messages[seen:]] == [other.node_heartbeat("edge-1")]


def _publish_as(broker: MosquittoBroker, username: str, password: str, topics: list[str]) -> None:
    """Connect as ``username`` and publish ``b"x"`` to each of ``topics`` in order (QoS 1:
    Mosquitto acknowledges a denied publish too, then drops it)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=username)
    client.username_pw_set(username, password)
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        for topic in topics:
            client.publish(topic, b"x", qos=1).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()
        close_wakeup_pair(client)
