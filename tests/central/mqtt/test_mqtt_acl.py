"""Who may say what on the broker: a real Mosquitto with a password file and the shipped
ACL (``deploy/mosquitto/acl``, used verbatim), the edge's real publisher and central's
real consumer; and MQTT over TLS with certificates the tests make."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import ValidationError

from central.membership.tracker import MembershipTracker, NodeLiveness
from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.settings import CentralSettings, MqttSettings
from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import CentralStatus, Event, Heartbeat, NodeStatus
from fleetwire.mqtt.tls import MqttTlsSettings
from fleetwire.mqtt.topics import Topics
from support.brokers import BrokerTls, Login, MosquittoBroker, Subscriber, close_wakeup_pair, takeover_closes_session
from support.certs import CertAuthority, LeafFiles

pytestmark = pytest.mark.fleet  # each test starts its own Mosquitto

REPO = Path(__file__).resolve().parents[3]
ACL = REPO / "deploy" / "mosquitto" / "acl"
TOPICS = Topics()
USERS = {"central": "central-secret", "edge-a": "a-secret", "edge-b": "b-secret", "dashboard": "dash-secret"}
DASHBOARD_ACL = "\nuser dashboard\ntopic read modelfleet/v1/#\n"
ALIVE = NodeLiveness.ALIVE


def ms() -> int:
    return int(time.time() * 1000)


def heartbeat(node_id: str, seq: int = 0, bdseq: int = 1) -> bytes:
    return Heartbeat(node_id=node_id, bdseq=bdseq, seq=seq, ts=ms(), interval_s=60).model_dump_json().encode()


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


class RawClient:
    """A bare paho client (an attacker's, or an edge's without our publisher)."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str | None = None,
        password: str | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{uuid.uuid4().hex[:8]}")
        self.client.reconnect_delay_set(0.05, 0.1)  # type: ignore[arg-type]  # a refused client stops at once
        if username is not None:
            self.client.username_pw_set(username, password)
        if context is not None:
            self.client.tls_set_context(context)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *_: self.closed.set()
        self.connack = threading.Event()
        self.closed = threading.Event()
        self.refused: Any = None
        self.host, self.port = host, port

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, props: Any) -> None:
        self.refused = reason_code if reason_code.is_failure else None
        self.connack.set()

    def __enter__(self) -> RawClient:
        self.client.connect(self.host, self.port, keepalive=10)
        self.client.loop_start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        close_wakeup_pair(self.client)

    def wait_connack(self) -> Any:
        """None when accepted, else the refusal's reason code."""
        assert self.connack.wait(5), "no CONNACK"
        return self.refused

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        if qos:
            info.wait_for_publish(5)  # Mosquitto acks a denied QoS 1 publish too, then drops it


def central_broker(port: int, **kw: Any) -> BrokerSettings:
    """Central's link to the broker on ``port``: quick reconnects, ``kw`` (login, TLS) on top."""
    return BrokerSettings(port=port, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=0.3, **kw)


class Central:
    """Central's membership side: a tracker fed by the real consumer."""

    def __init__(self, broker: BrokerSettings) -> None:
        settings = MqttSettings(default_interval_s=60)
        self.tracker: MembershipTracker = make_tracker(settings)
        self.consumer = MembershipConsumer(settings, self.tracker, broker=broker, central_id="acl-central")

    async def __aenter__(self) -> Central:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        self.tracker.close()


@contextlib.asynccontextmanager
async def edge(node_id: str, port: int, tmp_path: Path, **kw: Any) -> AsyncIterator[HeartbeatPublisher]:
    s = HeartbeatSettings(interval_s=0.2, stop_timeout_s=1.0)
    broker = BrokerSettings(port=port, reconnect_min_s=0.1, reconnect_max_s=0.3, **kw)
    publisher = HeartbeatPublisher(node_id, s, lambda: HeartbeatBody(), tmp_path / node_id, broker=broker)
    await publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


@pytest.fixture
def secured() -> Iterator[MosquittoBroker]:
    """Passwords for central, two edges and a dashboard; the shipped ACL plus a reader block."""
    with MosquittoBroker(users=USERS, acl=ACL.read_text() + DASHBOARD_ACL) as broker:
        yield broker


def credentials(user: str) -> dict[str, Any]:
    return {"username": user, "password": USERS[user]}


async def test_an_edge_with_credentials_is_seen_alive_and_others_are_refused(
    secured: MosquittoBroker, tmp_path: Path
) -> None:
    async with Central(central_broker(secured.port, **credentials("central"))) as central:
        assert await central.consumer.wait_connected(5)
        async with edge("edge-a", secured.port, tmp_path, **credentials("edge-a")) as a:
            assert await a.wait_connected(5)
            await wait_for(lambda: central.tracker.state_of("edge-a") is ALIVE, "edge-a alive")
            await wait_for(lambda: central.tracker.counters.heartbeats_processed >= 2, "edge-a heartbeats")
        await wait_for(lambda: central.tracker.state_of("edge-a") is NodeLiveness.DEAD, "edge-a clean offline")

    for username, password in ((None, None), ("edge-a", "wrong"), ("nobody", "x")):
        with RawClient(secured.host, secured.port, username, password) as client:
            assert client.wait_connack() is not None, f"{username!r} was let in"

    # An edge without a password is refused too, and keeps trying without ever beating.
    async with edge("edge-b", secured.port, tmp_path) as b:
        await wait_for(lambda: b.connect_failures >= 1, "edge-b refused")
        assert not b.connected and b.heartbeats_sent == 0

    # So is central without its credentials: it never connects, and counts the refusals.
    async with Central(central_broker(secured.port)) as central:
        await wait_for(lambda: central.consumer.connect_failures >= 1, "central refused")
        assert not central.consumer.connected


async def test_an_edge_cannot_publish_as_another_node_or_as_central(secured: MosquittoBroker) -> None:
    broker = central_broker(secured.port, **credentials("central"))
    async with Central(broker) as central:
        assert await central.consumer.wait_connected(5)
        tracker = central.tracker
        with (
            Subscriber(secured, f"{TOPICS.prefix}/#", **credentials("dashboard")) as seen,
            Subscriber(secured, f"{TOPICS.prefix}/#", **credentials("edge-b")) as edge_reader,
            RawClient(secured.host, secured.port, **credentials("edge-a")) as a,
            RawClient(secured.host, secured.port, **credentials("dashboard")) as d,
        ):
            assert a.wait_connack() is None and d.wait_connack() is None
            seen.wait_topic(TOPICS.central_status)  # central's retained "online"
            forged_event = Event(type="node_dead", node_id="edge-b", ts=ms()).model_dump_json().encode()
            offline = CentralStatus(state="offline", ts=ms(), central_id="forged").model_dump_json().encode()
            birth_b = NodeStatus(state="online", bdseq=1, ts=ms()).model_dump_json().encode()
            a.publish(TOPICS.node_heartbeat("edge-b"), heartbeat("edge-b"), qos=0)
            a.publish(TOPICS.node_status("edge-b"), birth_b, retain=True)
            a.publish(TOPICS.central_status, offline, retain=True)
            a.publish(TOPICS.events, forged_event)
            a.publish(f"{TOPICS.prefix}/nodes/edge-a/other", b"x")
            # a read-only user cannot speak for central either (QoS 1: routed before its ack)
            d.publish(TOPICS.events, forged_event)
            d.publish(TOPICS.central_status, offline, retain=True)
            # Its own heartbeat goes through; the broker handles one client's packets in
            # order, so once this one is in, the forged ones before it would be too.
            a.publish(TOPICS.node_heartbeat("edge-a"), heartbeat("edge-a"), qos=0)
            await seen.async_wait_topic(TOPICS.node_heartbeat("edge-a"))
            await wait_for(lambda: tracker.state_of("edge-a") is ALIVE, "edge-a alive")
            await seen.async_wait_topic(TOPICS.events)  # central's own node_alive, published

        forged = {TOPICS.node_heartbeat("edge-b"), TOPICS.node_status("edge-b"), f"{TOPICS.prefix}/nodes/edge-a/other"}
        assert not [m.topic for m in seen.messages if m.topic in forged]
        events = [Event.model_validate_json(m.payload) for m in seen.on(TOPICS.events)]
        assert [(e.type, e.node_id) for e in events] == [("node_alive", "edge-a")]  # central's own
        statuses = [CentralStatus.model_validate_json(m.payload) for m in seen.on(TOPICS.central_status)]
        assert [s.central_id for s in statuses] == ["acl-central"] and statuses[0].state == "online"
        assert tracker.get("edge-b") is None
        assert tracker.counters.heartbeats_processed == 1 and tracker.counters.statuses_processed == 0
        assert tracker.counters.malformed_dropped == 0
        # An edge reads central's status (to retry as soon as central is back) and nothing else,
        # not the others' heartbeats, statuses or the events; and only the real central's.
        assert {m.topic for m in edge_reader.messages} == {TOPICS.central_status}
        read = [CentralStatus.model_validate_json(m.payload) for m in edge_reader.messages]
        assert [s.central_id for s in read] == ["acl-central"]


async def test_a_heartbeat_whose_payload_names_another_node_is_dropped_and_counted(secured: MosquittoBroker) -> None:
    async with Central(central_broker(secured.port, **credentials("central"))) as central:
        assert await central.consumer.wait_connected(5)
        tracker = central.tracker
        with RawClient(secured.host, secured.port, **credentials("edge-a")) as a:
            assert a.wait_connack() is None
            a.publish(TOPICS.node_heartbeat("edge-a"), heartbeat("edge-a", seq=0), qos=0)
            await wait_for(lambda: tracker.state_of("edge-a") is ALIVE, "edge-a alive")
            before = tracker.get("edge-a")
            # its own topic (the ACL lets it), someone else's id in the payload
            a.publish(TOPICS.node_heartbeat("edge-a"), heartbeat("edge-b", seq=1), qos=0)
            await wait_for(lambda: tracker.counters.malformed_dropped == 1, "the mismatch counted")
        after = tracker.get("edge-a")
        assert before is not None and after is not None
        assert after.last_heartbeat_at == before.last_heartbeat_at
        assert tracker.get("edge-b") is None and tracker.counters.heartbeats_processed == 1


# ----------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LeafFiles]:
    """The fleet CA's broker and client certificates, and one from a CA nobody trusts."""
    directory = tmp_path_factory.mktemp("mqtt-pki")
    fleet = CertAuthority(directory, "fleet")
    rogue = CertAuthority(directory / "rogue", "rogue")
    # the broker's certificate names 127.0.0.1 only: dialling "localhost" must fail
    return {
        "broker": fleet.issue("broker", sans=("127.0.0.1",)),
        "central": fleet.issue("central"),
        "rogue": rogue.issue("rogue-broker"),
    }


@pytest.fixture
def tls_broker(pki: dict[str, LeafFiles]) -> Iterator[MosquittoBroker]:
    leaf = pki["broker"]
    tls = BrokerTls(leaf.cert_file, leaf.key_file, leaf.ca_file)
    with MosquittoBroker(users=USERS, acl=ACL, tls=tls) as broker:
        yield broker


async def test_edge_heartbeats_reach_central_over_tls(
    tls_broker: MosquittoBroker, pki: dict[str, LeafFiles], tmp_path: Path
) -> None:
    assert tls_broker.tls_port is not None
    tls = {"enabled": True, "ca_file": pki["broker"].ca_file}
    broker = central_broker(tls_broker.tls_port, tls=tls, **credentials("central"))
    async with Central(broker) as central:
        assert await central.consumer.wait_connected(5)
        async with edge("edge-a", tls_broker.tls_port, tmp_path, tls=tls, **credentials("edge-a")) as a:
            assert await a.wait_connected(5)
            await wait_for(lambda: central.tracker.state_of("edge-a") is ALIVE, "edge-a alive over TLS")
            await wait_for(lambda: central.tracker.counters.heartbeats_processed >= 2, "heartbeats over TLS")
        # A burst arrives in a few TLS records: every heartbeat in them is read, with no
        # later traffic needed to wake the reader (decrypted bytes are not seen by select).
        burst, before = 300, central.tracker.counters.heartbeats_processed
        context = MqttTlsSettings(**tls).ssl_context()
        with RawClient("127.0.0.1", tls_broker.tls_port, context=context, **credentials("edge-b")) as b:
            assert b.wait_connack() is None
            for seq in range(burst):
                b.publish(TOPICS.node_heartbeat("edge-b"), heartbeat("edge-b", seq=seq), qos=0)
            await wait_for(lambda: central.tracker.counters.heartbeats_processed == before + burst, "the burst")
        assert central.tracker.counters.malformed_dropped == 0


async def test_a_broker_that_requires_client_certificates_takes_central_with_one(
    pki: dict[str, LeafFiles],
) -> None:
    broker_leaf, central_leaf = pki["broker"], pki["central"]
    tls = BrokerTls(broker_leaf.cert_file, broker_leaf.key_file, broker_leaf.ca_file, require_certificate=True)
    with MosquittoBroker(users=USERS, acl=ACL, tls=tls) as broker:
        assert broker.tls_port is not None
        mutual = {"enabled": True, **{k: getattr(central_leaf, k) for k in ("ca_file", "cert_file", "key_file")}}
        async with Central(central_broker(broker.tls_port, tls=mutual, **credentials("central"))) as central:
            assert await central.consumer.wait_connected(5)
        # without a certificate the broker ends the handshake
        no_cert = MqttTlsSettings(enabled=True, ca_file=central_leaf.ca_file).ssl_context()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:  # TLS 1.3: the handshake "succeeds" and the broker closes; 1.2: it fails
                with RawClient("127.0.0.1", broker.tls_port, context=no_cert, **credentials("central")) as bare:
                    refused = bare.closed.wait(5) and not bare.connack.is_set()
            except OSError:
                refused = True
            gc.collect()
        assert refused, "a client without a certificate got a CONNACK"


def test_plaintext_and_untrusting_clients_cannot_use_the_tls_port(
    tls_broker: MosquittoBroker, pki: dict[str, LeafFiles]
) -> None:
    port = tls_broker.tls_port
    assert port is not None
    plain = RawClient("127.0.0.1", port, **credentials("edge-a"))
    with plain:
        assert plain.closed.wait(5), "the TLS port kept a plaintext connection open"
        assert not plain.connack.is_set(), "a plaintext CONNECT was answered on the TLS port"
    wrong_ca = MqttTlsSettings(enabled=True, ca_file=pki["rogue"].ca_file).ssl_context()
    right_ca = MqttTlsSettings(enabled=True, ca_file=pki["broker"].ca_file).ssl_context()
    # paho does not close the socket of a failed handshake; it is collected here, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        # A client that trusts another CA refuses the broker's certificate.
        with pytest.raises(ssl.SSLCertVerificationError):
            RawClient("127.0.0.1", port, context=wrong_ca, **credentials("edge-a")).__enter__()
        # So does one that dials a name the certificate does not carry.
        with pytest.raises(ssl.SSLCertVerificationError):
            RawClient("localhost", port, context=right_ca, **credentials("edge-a")).__enter__()
        gc.collect()


def test_tls_and_credential_settings_are_checked_at_start_up(
    tmp_path: Path, pki: dict[str, LeafFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="ca_file"):
        MqttTlsSettings(enabled=True, ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValidationError, match="cert_file and key_file"):
        MqttTlsSettings(enabled=True, cert_file=pki["broker"].cert_file)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ValidationError, match="ca_file"):
        BrokerSettings(tls={"enabled": True, "ca_file": garbage})
    monkeypatch.setenv("MODELFLEET_BROKER__USERNAME", "central")
    monkeypatch.setenv("MODELFLEET_BROKER__PASSWORD", "s3cret")
    monkeypatch.setenv("MODELFLEET_BROKER__TLS__ENABLED", "true")
    monkeypatch.setenv("MODELFLEET_BROKER__TLS__CA_FILE", str(pki["broker"].ca_file))
    broker = CentralSettings(data_dir=tmp_path).broker
    assert broker.username == "central" and broker.tls.enabled
    assert broker.password is not None and broker.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(broker)


def test_the_shipped_broker_config_requires_a_password_and_the_acl(pki: dict[str, LeafFiles]) -> None:
    """deploy/mosquitto/mosquitto.conf as it is (ports and paths made local): logins, TLS
    with client certificates, and client ids bound to the logins."""
    leaf = pki["broker"]
    users = {**USERS, "healthcheck": "health-secret"}
    tls = BrokerTls(leaf.cert_file, leaf.key_file, leaf.ca_file)
    with MosquittoBroker(users=users, acl=ACL, tls=tls) as broker:
        broker.use_config(broker.localized((REPO / "deploy" / "mosquitto" / "mosquitto.conf").read_text()))
        assert broker.tls_port is not None
        with RawClient(broker.host, broker.port) as anonymous:
            assert anonymous.wait_connack() is not None
        # what the Compose healthcheck does: its own login on the loopback listener reads the uptime
        with Subscriber(broker, "$SYS/broker/uptime", username="healthcheck", password="health-secret") as health:
            health.wait_topic("$SYS/broker/uptime")

        def login(user: str) -> Login:
            client = pki["central"]  # any certificate of the fleet CA
            settings = MqttTlsSettings(
                enabled=True, ca_file=leaf.ca_file, cert_file=client.cert_file, key_file=client.key_file
            )
            return Login(user, users[user], settings.ssl_context())

        # edge-a's login under edge-b's client id does not close edge-b's session
        for client_id in ("edge-edge-b", "edge-b"):
            assert not takeover_closes_session(
                broker.host, broker.tls_port, client_id, login("edge-b"), login("edge-a")
            )
        # nor does the healthcheck's close central's (it logged in as central before)
        assert not takeover_closes_session(
            broker.host, broker.tls_port, "central", login("central"), login("healthcheck")
        )
