"""The broker ``modelfleet up --secure`` starts (its own config, certificates, password
file and ACL, from ``prepare`` and ``start_broker``), with central's real consumer and an
edge's real publisher: one edge's login cannot take over another edge's MQTT session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from central.membership.tracker import MembershipTracker, NodeLiveness
from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.settings import MqttSettings
from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.tls import MqttTlsSettings
from modelfleet.up.broker import RunningBroker, find_mosquitto, start_broker
from modelfleet.up.children import ChildGroup
from modelfleet.up.secure import SecureFleet, prepare
from support.brokers import Login, connect_once

pytestmark = pytest.mark.fleet  # `modelfleet up`: a broker, central and edges as processes

EDGES = ["edge-1", "edge-2"]


@pytest.fixture
def secure(tmp_path: Path) -> SecureFleet:
    return prepare(tmp_path / "secure", tmp_path / "central", EDGES)


@pytest.fixture
def broker(secure: SecureFleet, tmp_path: Path) -> Iterator[RunningBroker]:
    assert find_mosquitto() is not None, "these tests need mosquitto (scripts/ensure_mosquitto.sh)"
    group = ChildGroup(tmp_path / "logs")
    try:
        yield start_broker(group, "mosquitto", 0, tmp_path / "broker", security=secure.broker)
    finally:
        group.stop()


def credentials(secure: SecureFleet, user: str) -> dict[str, Any]:
    """The MQTT login and TLS settings ``up --secure`` gives ``user``, and quick reconnects."""
    leaf = secure.central_tls if user == "central" else secure.edge_tls[user]
    return {
        "username": user,
        "password": secure.mqtt_passwords[user],
        "tls": leaf.tls(),
        "reconnect_min_s": 0.1,
        "reconnect_max_s": 0.3,
    }


def login(secure: SecureFleet, user: str) -> Login:
    found = credentials(secure, user)
    context = MqttTlsSettings.model_validate(found["tls"]).ssl_context()
    return Login(user, found["password"], context)


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def more_heartbeats(tracker: MembershipTracker, count: int) -> None:
    wanted = tracker.counters.heartbeats_processed + count
    await wait_for(lambda: tracker.counters.heartbeats_processed >= wanted, f"{count} more heartbeats")


async def test_one_edges_login_cannot_close_another_edges_session(
    secure: SecureFleet, broker: RunningBroker, tmp_path: Path
) -> None:
    central_broker = BrokerSettings(host=broker.host, port=broker.port, keepalive_s=5, **credentials(secure, "central"))
    tracker = make_tracker(MqttSettings())
    consumer = MembershipConsumer(MqttSettings(), tracker, broker=central_broker, central_id="secure-central")
    edge_broker = BrokerSettings(host=broker.host, port=broker.port, **credentials(secure, "edge-2"))
    edge = HeartbeatPublisher(
        "edge-2", HeartbeatSettings(interval_s=0.2), lambda: HeartbeatBody(), tmp_path / "edge-2", broker=edge_broker
    )
    await consumer.start()
    try:
        assert await consumer.wait_connected(10)
        assert consumer.client_id == "central"  # its login: nobody else can take its id either
        await edge.start()
        await wait_for(lambda: tracker.state_of("edge-2") is NodeLiveness.ALIVE, "edge-2 alive")
        # With edge-1's certificate and password, under edge-2's client id: the default one
        # before logins named it, and the one it has now.
        for client_id in ("edge-edge-2", edge_broker.effective_client_id("edge-edge-2")):
            accepted = await asyncio.to_thread(
                connect_once, broker.host, broker.port, client_id, login(secure, "edge-1")
            )
            assert accepted  # its own login is good: only the client id it asked for is not its
            # once central has two more heartbeats of edge-2, a Last Will the broker had
            # published at a takeover would have reached it before them
            await more_heartbeats(tracker, 2)
        assert edge.disconnects == 0 and edge.connects == 1
        assert [e.type for e in tracker.events() if e.node_id == "edge-2"] == ["node_alive"]
    finally:
        await edge.stop()
        await consumer.stop()
        tracker.close()
