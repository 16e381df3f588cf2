"""The edge's MQTT birth/death/heartbeat publisher against a real Mosquitto on a free port."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from edge_node.cache import CacheStats
from edge_node.heartbeat import (
    BDSEQ_FILE,
    BdseqStore,
    HeartbeatBody,
    HeartbeatPublisher,
    HeartbeatSources,
)
from edge_node.heartbeat.publisher import first_reconnect_delay_s
from edge_node.inference import LoadTracker
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import CacheInfo, LoadInfo, ModelInfo, ShadowInfo
from fleetwire.mqtt.topics import Topics
from support.brokers import Message, MosquittoBroker, Subscriber, free_port, retained

REPO = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((REPO / "fleetwire" / "schemas" / "heartbeat.schema.json").read_text())
TOPICS = Topics()
INTERVAL = 0.2


def body() -> HeartbeatBody:
    return HeartbeatBody(
        state="online",
        load=LoadInfo(inflight=2, queue_depth=1, cpu_percent=12.5, rps=40.0, p50_ms=3.0, p99_ms=9.5),
        models=[
            ModelInfo(name="mlp", version="v1", state="ready"),
            ModelInfo(name="bad", version="v2", state="failed", error="boom"),
        ],
        cache=CacheInfo(bytes=10, capacity=100, hits=3, misses=1),
        grpc_address="127.0.0.1:5001",
        http_address="127.0.0.1:8001",
    )


def settings(**overrides: Any) -> HeartbeatSettings:
    base: dict[str, Any] = {"interval_s": INTERVAL, "stop_timeout_s": 1.0}
    base.update(overrides)
    return HeartbeatSettings(**base)


def broker_settings(broker: MosquittoBroker, **overrides: Any) -> BrokerSettings:
    base: dict[str, Any] = {"port": broker.port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3}
    base.update(overrides)
    return BrokerSettings(**base)


PublisherFactory = Callable[..., HeartbeatPublisher]


@pytest.fixture
async def publishers(tmp_path: Path) -> AsyncIterator[PublisherFactory]:
    """Builds publishers and stops every one of them at teardown."""
    made: list[HeartbeatPublisher] = []

    def make(
        broker: MosquittoBroker,
        node_id: str = "edge-a",
        data_dir: Path | None = None,
        snapshot: Callable[[], HeartbeatBody] = body,
        **overrides: Any,
    ) -> HeartbeatPublisher:
        link = {name: overrides.pop(name) for name in BrokerSettings.model_fields if name in overrides}
        publisher = HeartbeatPublisher(
            node_id,
            settings(**overrides),
            snapshot,
            data_dir or tmp_path / node_id,
            broker=broker_settings(broker, **link),
        )
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        await publisher.stop()


def status(msg: Message) -> dict[str, Any]:
    return dict(msg.json())


def is_status(node: str, state: str | None = None, bdseq: int | None = None) -> Callable[[Message], bool]:
    def check(msg: Message) -> bool:
        if msg.topic != TOPICS.node_status(node):
            return False
        data = msg.json()
        return (state is None or data["state"] == state) and (bdseq is None or data["bdseq"] == bdseq)

    return check


def heartbeats(sub: Subscriber, node: str = "edge-a") -> list[dict[str, Any]]:
    return [m.json() for m in sub.on(TOPICS.node_heartbeat(node))]


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- birth, heartbeats -------------------------------------------------------------------


async def test_birth_is_retained_and_first_heartbeat_follows_it(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    with Subscriber(mosquitto, [TOPICS.all_status, TOPICS.all_heartbeats]) as sub:
        publisher = publishers(mosquitto, interval_s=5.0)  # only the at-connect heartbeat within the test
        await publisher.start()
        assert await publisher.wait_connected(5)
        assert publisher.bdseq == 1 and publisher.connects == 1
        first = await sub.async_wait_for(lambda m: True, count=2)
    assert [m.topic for m in first] == [TOPICS.node_status("edge-a"), TOPICS.node_heartbeat("edge-a")]
    birth, beat = first[0].json(), first[1].json()
    assert birth["state"] == "online" and birth["bdseq"] == 1 and first[0].qos == 1
    assert beat["bdseq"] == 1 and beat["seq"] == 0
    retained = await asyncio.to_thread(_retained, mosquitto, TOPICS.node_status("edge-a"))
    assert retained is not None and retained.retain and status(retained)["state"] == "online"
    assert status(retained)["bdseq"] == 1


def _retained(broker: MosquittoBroker, topic: str) -> Message | None:
    return retained(broker, topic, timeout=2.0)


async def test_heartbeats_come_every_interval_with_growing_seq_and_match_the_schema(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    with Subscriber(mosquitto, TOPICS.all_heartbeats) as sub:
        publisher = publishers(mosquitto)
        await publisher.start()
        msgs = await sub.async_wait_topic(TOPICS.node_heartbeat("edge-a"), timeout=5, count=8)
    beats = [m.json() for m in msgs]
    assert [b["seq"] for b in beats] == list(range(8))
    assert {b["bdseq"] for b in beats} == {1}
    for beat in beats:
        jsonschema.validate(beat, SCHEMA)
    assert beats[0]["models"][1] == {"name": "bad", "version": "v2", "state": "failed", "error": "boom"}
    assert beats[0]["cache"]["capacity"] == 100 and beats[0]["load"]["rps"] == 40.0
    assert beats[0]["grpc_address"] == "127.0.0.1:5001" and beats[0]["http_address"] == "127.0.0.1:8001"
    assert beats[0]["interval_s"] == INTERVAL and beats[0]["node_id"] == "edge-a"
    gaps = [b.at - a.at for a, b in itertools.pairwise(msgs[1:])]  # after the at-connect one
    assert 0.12 < sum(gaps) / len(gaps) < 0.3, gaps
    ts = [b["ts"] for b in beats]
    assert ts == sorted(ts)
    assert publisher.heartbeats_sent >= 8
    assert all(m.qos == 0 and not m.retain for m in msgs)


async def test_a_failing_snapshot_skips_beats_without_stopping(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    calls = {"n": 0}

    def flaky() -> HeartbeatBody:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise RuntimeError("snapshot broke")
        return body()

    with Subscriber(mosquitto, TOPICS.all_heartbeats) as sub:
        publisher = publishers(mosquitto, snapshot=flaky)
        await publisher.start()
        msgs = await sub.async_wait_topic(TOPICS.node_heartbeat("edge-a"), timeout=5, count=3)
    assert [m.json()["seq"] for m in msgs] == [0, 1, 2]  # seq counts heartbeats sent, not attempts
    assert publisher.snapshot_errors >= 2


# -- death -------------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from pathlib import Path
from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings

async def main():
    settings = HeartbeatSettings(interval_s=float(sys.argv[3]))
    broker = BrokerSettings(port=int(sys.argv[1]))
    publisher = HeartbeatPublisher("edge-child", settings, HeartbeatBody, Path(sys.argv[2]), broker=broker)
    await publisher.start()
    if not await publisher.wait_connected(10):
        print("no connection", flush=True)
        return
    print(f"ready {publisher.bdseq} {broker.effective_keepalive_s(settings.default_keepalive_s)}", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class Child:
    """A publisher in a child process (so that it can die for real)."""

    def __init__(self, broker: MosquittoBroker, data_dir: Path, interval: float = INTERVAL) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(broker.port), str(data_dir), str(interval)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    async def ready(self, timeout: float = 12.0) -> tuple[int, int]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line.startswith("ready"):
            self.close()
            raise AssertionError(
                f"child did not connect: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        _, bdseq, keepalive = line.split()
        return int(bdseq), int(keepalive)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def child_factory() -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def make(*args: Any, **kwargs: Any) -> Child:
        child = Child(*args, **kwargs)
        children.append(child)
        return child

    yield make
    for child in children:
        child.close()


async def test_last_will_publishes_offline_with_the_birth_bdseq_when_the_process_dies(
    mosquitto: MosquittoBroker, tmp_path: Path, child_factory: Callable[..., Child]
) -> None:
    BdseqStore.in_dir(tmp_path).reserve()  # the child's first connection gets 2
    child = child_factory(mosquitto, tmp_path)
    bdseq, keepalive = await child.ready()
    assert bdseq == 2 and keepalive == 2
    with Subscriber(mosquitto, TOPICS.node_status("edge-child")) as sub:
        birth = (await sub.async_wait_for(is_status("edge-child", "online")))[0]
        assert birth.retain and birth.json()["bdseq"] == bdseq
        killed = time.monotonic()
        child.proc.send_signal(signal.SIGKILL)
        death = (await sub.async_wait_for(is_status("edge-child", "offline"), timeout=keepalive * 1.5 + 1))[0]
    assert death.json()["bdseq"] == bdseq
    assert death.at - killed < keepalive * 1.5
    retained = await asyncio.to_thread(_retained, mosquitto, TOPICS.node_status("edge-child"))
    assert retained is not None and retained.json() == death.json()


async def test_last_will_fires_after_keepalive_when_the_process_hangs(
    mosquitto: MosquittoBroker, tmp_path: Path, child_factory: Callable[..., Child]
) -> None:
    child = child_factory(mosquitto, tmp_path)
    bdseq, keepalive = await child.ready()
    with Subscriber(mosquitto, TOPICS.node_status("edge-child")) as sub:
        await sub.async_wait_for(is_status("edge-child", "online", bdseq))
        frozen = time.monotonic()
        child.proc.send_signal(signal.SIGSTOP)  # the socket stays open; only the keep-alive notices
        death = (await sub.async_wait_for(is_status("edge-child", "offline"), timeout=keepalive * 3 + 1))[0]
    assert death.json()["bdseq"] == bdseq
    # MQTT says 1.5 × keep-alive of silence; Mosquitto 2.0.11 measures ~2.5 × (5.2 s for 2 s)
    assert keepalive * 1.0 < death.at - frozen < keepalive * 3 + 1


async def test_clean_stop_publishes_offline_itself_with_the_current_bdseq(
    mosquitto: MosquittoBroker, publishers: PublisherFactory, tmp_path: Path
) -> None:
    BdseqStore.in_dir(tmp_path / "edge-a").reserve()
    publisher = publishers(mosquitto)
    await publisher.start()
    assert await publisher.wait_connected(5)
    assert publisher.bdseq == 2
    with Subscriber(mosquitto, TOPICS.node_status("edge-a")) as sub:
        await sub.async_wait_for(is_status("edge-a", "online", 2))
        started = time.monotonic()
        await publisher.stop()
        assert time.monotonic() - started < 1.0
        assert not publisher.connected
        offline = await sub.async_wait_for(is_status("edge-a", "offline"))
        await asyncio.sleep(0.3)
        statuses = sub.on(TOPICS.node_status("edge-a"))
    assert offline[0].json()["bdseq"] == 2 and not offline[0].retain  # live delivery of a retained publish
    assert [m.json()["state"] for m in statuses] == ["online", "offline"]  # no will after a clean stop
    retained = await asyncio.to_thread(_retained, mosquitto, TOPICS.node_status("edge-a"))
    assert retained is not None and retained.json()["state"] == "offline" and retained.json()["bdseq"] == 2
    await publisher.stop()  # idempotent


async def test_stop_against_a_hung_broker_leaves_the_death_to_the_will(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    publisher = publishers(mosquitto, stop_timeout_s=0.5)
    await publisher.start()
    assert await publisher.wait_connected(5)
    mosquitto.pause()
    try:
        started = time.monotonic()
        await publisher.stop()
        assert time.monotonic() - started < 3.0
    finally:
        mosquitto.resume()
    retained = await asyncio.to_thread(_retained, mosquitto, TOPICS.node_status("edge-a"))
    assert retained is not None and retained.json()["state"] == "offline" and retained.json()["bdseq"] == 1


# -- broker faults -----------------------------------------------------------------------


async def test_reconnects_after_broker_restart_with_the_next_bdseq_and_drops_beats_meanwhile(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    publisher = publishers(mosquitto, reconnect_min_s=0.2, reconnect_max_s=0.2)
    await publisher.start()
    assert await publisher.wait_connected(5)
    await asyncio.sleep(3 * INTERVAL)
    assert publisher.bdseq == 1 and publisher.heartbeats_sent >= 2
    mosquitto.kill()
    await wait_until(lambda: not publisher.connected, 3)
    dropped_before = publisher.heartbeats_dropped
    await asyncio.sleep(6 * INTERVAL)
    assert publisher.heartbeats_dropped - dropped_before >= 3  # dropped, not queued
    assert publisher.connected is False

    await asyncio.to_thread(mosquitto.start)  # same port, empty (no persistence)
    with Subscriber(mosquitto, [TOPICS.all_status, TOPICS.all_heartbeats]) as sub:
        assert await publisher.wait_connected(5)
        assert publisher.bdseq == 2 and publisher.connects == 2 and publisher.disconnects == 1
        await sub.async_wait_for(is_status("edge-a", "online", 2))
        beats = await sub.async_wait_topic(TOPICS.node_heartbeat("edge-a"), count=4)
        await asyncio.sleep(2 * INTERVAL)
        everything = heartbeats(sub)
    seqs = [b.json()["seq"] for b in beats]
    assert {b.json()["bdseq"] for b in beats} == {2}
    assert seqs == list(range(seqs[0], seqs[0] + 4)) and seqs[0] <= 1  # a fresh count, no backlog
    assert all(b["bdseq"] == 2 for b in everything)  # nothing from the broker's absence arrived late
    assert beats[-1].at - beats[0].at > 2 * INTERVAL  # at the interval, not in a burst
    retained = await asyncio.to_thread(_retained, mosquitto, TOPICS.node_status("edge-a"))
    assert retained is not None and (retained.json()["state"], retained.json()["bdseq"]) == ("online", 2)
    assert BdseqStore.in_dir(publisher._store.path.parent).last == 2


async def test_each_lost_connection_draws_a_new_random_first_reconnect_wait(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    """paho never jitters: edges that lost a restarted broker together would all come back at
    the same instants. Each publisher gives paho a first wait of its own, drawn again whenever
    a connection is lost (paho doubles it from there)."""
    fleet = [publishers(mosquitto, f"edge-{i}", reconnect_min_s=0.2, reconnect_max_s=1.0) for i in range(4)]
    for publisher in fleet:
        await publisher.start()
    for publisher in fleet:
        assert await publisher.wait_connected(5)
    before = [_first_wait(p) for p in fleet]
    for publisher in fleet:
        assert publisher._client is not None
        sock = publisher._client.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)
    for publisher in fleet:
        await wait_until(lambda p=publisher: p.connects == 2 and p.connected, 5)
    after = [_first_wait(p) for p in fleet]
    assert all(0.1 <= wait <= 0.2 for wait in before + after)
    assert len(set(before)) == len(fleet)  # not one instant for the whole fleet
    assert all(a != b for a, b in zip(before, after, strict=True))  # a new draw per lost connection


def _first_wait(publisher: HeartbeatPublisher) -> float:
    """The first reconnect wait paho's client holds now (paho has no public getter)."""
    assert publisher._client is not None
    return float(publisher._client._reconnect_min_delay)


async def test_the_will_of_every_connection_carries_the_bdseq_of_its_birth(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    with Subscriber(mosquitto, TOPICS.node_status("edge-a")) as sub:
        publisher = publishers(mosquitto, reconnect_min_s=0.05, reconnect_max_s=0.1)
        await publisher.start()
        for bdseq in (1, 2, 3):
            assert await publisher.wait_connected(5)
            await sub.async_wait_for(is_status("edge-a", "online", bdseq))
            assert publisher._client is not None
            sock = publisher._client.socket()
            assert isinstance(sock, socket.socket)
            sock.shutdown(socket.SHUT_RDWR)  # the connection breaks without DISCONNECT: the broker sends the will
            await sub.async_wait_for(is_status("edge-a", "offline", bdseq))
        await sub.async_wait_for(is_status("edge-a", "online", 4))
        await publisher.stop()
        await sub.async_wait_for(is_status("edge-a", "offline", 4))
        states = [(m.json()["state"], m.json()["bdseq"]) for m in sub.on(TOPICS.node_status("edge-a"))]
    assert states == [(state, n) for n in (1, 2, 3, 4) for state in ("online", "offline")]
    assert publisher.connects == 4 and publisher.disconnects == 3


async def test_starts_without_a_broker_and_connects_once_it_appears(
    mosquitto: MosquittoBroker, publishers: PublisherFactory
) -> None:
    mosquitto.stop()
    publisher = publishers(mosquitto)
    await publisher.start()
    await asyncio.sleep(4 * INTERVAL)
    assert not publisher.connected and publisher.heartbeats_dropped >= 2 and publisher.connect_failures >= 1
    await asyncio.to_thread(mosquitto.start)
    assert await publisher.wait_connected(5)
    assert publisher.bdseq == 1  # failed attempts use no number


async def test_stop_is_quick_when_the_broker_never_came(tmp_path: Path) -> None:
    s = HeartbeatSettings(interval_s=INTERVAL)
    broker = BrokerSettings(port=free_port(), reconnect_min_s=0.1, reconnect_max_s=0.2)
    publisher = HeartbeatPublisher("edge-x", s, body, tmp_path, broker=broker)
    await publisher.start()
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await publisher.stop()
    assert time.monotonic() - started < 2.0
    assert publisher.connects == 0 and publisher.heartbeats_sent == 0


async def test_disabled_publisher_does_nothing(tmp_path: Path) -> None:
    publisher = HeartbeatPublisher("edge-x", HeartbeatSettings(enabled=False), body, tmp_path)
    await publisher.start()
    assert not publisher.connected and not publisher.running
    await publisher.stop()
    assert not (tmp_path / BDSEQ_FILE).exists()


# -- bdseq -------------------------------------------------------------------------------


async def test_bdseq_persists_across_publisher_instances(
    mosquitto: MosquittoBroker, publishers: PublisherFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "shared"
    seen = []
    for _ in range(2):
        publisher = publishers(mosquitto, data_dir=data_dir)
        await publisher.start()
        assert await publisher.wait_connected(5)
        seen.append(publisher.bdseq)
        await publisher.stop()
    assert seen == [1, 2]
    assert (data_dir / BDSEQ_FILE).read_text().strip() == "2"
    assert sorted(p.name for p in data_dir.iterdir()) == [BDSEQ_FILE]  # no temp files left


def test_bdseq_store_reserves_in_order_and_survives_garbage(tmp_path: Path) -> None:
    store = BdseqStore.in_dir(tmp_path / "new")
    assert store.last == 0
    assert [store.reserve(), store.reserve(), store.reserve()] == [1, 2, 3]
    assert BdseqStore.in_dir(tmp_path / "new").last == 3
    (tmp_path / "new" / BDSEQ_FILE).write_text("not a number")
    assert BdseqStore.in_dir(tmp_path / "new").reserve() == 1
    (tmp_path / "new" / BDSEQ_FILE).write_text("-5\n")
    assert BdseqStore.in_dir(tmp_path / "new").last == 0


def test_bdseq_store_keeps_counting_when_the_disk_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = BdseqStore(blocker / "sub" / BDSEQ_FILE)  # its parent can't be created
    assert [store.reserve(), store.reserve()] == [1, 2]


# -- settings, load, snapshot --------------------------------------------------------------


def test_settings_defaults_and_keepalive() -> None:
    s, b = HeartbeatSettings(), BrokerSettings()
    assert (b.host, b.port, b.topic_prefix, s.interval_s, s.enabled) == ("127.0.0.1", 1883, "modelfleet/v1", 5.0, True)
    assert b.effective_keepalive_s(s.default_keepalive_s) == 10 and b.effective_client_id("edge-n1") == "edge-n1"
    assert HeartbeatSettings(interval_s=0.2).default_keepalive_s == 2
    assert HeartbeatSettings(interval_s=1.2).default_keepalive_s == 3
    assert BrokerSettings(keepalive_s=7).effective_keepalive_s(2) == 7
    assert BrokerSettings(client_id="x").effective_client_id("edge-n1") == "x"
    # with a login the client id is the user name (the shipped brokers bind them)
    assert BrokerSettings(username="n1", client_id="x").effective_client_id("edge-n1") == "n1"
    with pytest.raises(ValidationError):
        HeartbeatSettings(interval_s=0)
    for bad in ({"keepalive_s": 0}, {"reconnect_min_s": 5, "reconnect_max_s": 1}):
        with pytest.raises(ValidationError):
            BrokerSettings(**bad)
    for name, info in HeartbeatSettings.model_fields.items():
        assert info.description, name


def test_the_first_reconnect_wait_is_drawn_in_the_upper_half_of_reconnect_min_s() -> None:
    broker = BrokerSettings(reconnect_min_s=0.4, reconnect_max_s=10)
    waits = [first_reconnect_delay_s(broker) for _ in range(200)]
    assert all(0.2 <= w <= 0.4 for w in waits)
    assert min(waits) < 0.25 and max(waits) > 0.35  # spread over the window, not one instant


def test_heartbeat_sources_snapshot_reports_what_the_sources_read() -> None:
    models = [
        SimpleNamespace(
            name="m", version="1", state="failed", error="x" * 5000, errors=0, shadow_info=None, generation_info=None
        ),
        SimpleNamespace(
            name="m",
            version="2",
            state="ready",
            error=None,
            errors=3,
            shadow_info=ShadowInfo(samples=4),
            generation_info=None,
        ),
    ]
    refusals = {("m", "1"): "already listed", ("big", "7"): "needs 9 GB, the cache holds 1 GB"}
    stats = CacheStats(
        bytes=5, capacity=50, pinned_bytes=0, entries=9, hits=1, misses=2, bytes_read=0, bytes_written=0, evictions=0
    )
    tracker = LoadTracker()
    sources = HeartbeatSources(
        addresses=lambda: ("h:1", "h:2"),
        cache=lambda: stats,
        models=lambda: models,
        refusals=lambda: refusals,
        failures=lambda: {("m", "2"): ("disk", "known"), ("m", "3"): ("network", "no source delivered")},
        load=tracker,
        state=lambda: "draining",
    )
    with tracker.track():
        snap = sources.snapshot()
    assert snap.state == "draining" and snap.grpc_address == "h:1" and snap.http_address == "h:2"
    assert snap.cache == CacheInfo(bytes=5, capacity=50, hits=1, misses=2)
    assert snap.load.inflight == 1
    failed, ready, unfetched, refused = snap.models
    assert failed.state == "failed" and failed.error == "x" * 512 and failed.reason == "load"
    assert (ready.version, ready.state, ready.errors, ready.error, ready.reason) == ("2", "ready", 3, None, None)
    assert failed.shadow is None and ready.shadow == ShadowInfo(samples=4)  # INT8 against FP32 on live samples
    # a version the materializer failed is reported with its reason code, unless the runtime knows it
    assert (unfetched.version, unfetched.state, unfetched.reason) == ("3", "failed", "network")
    assert unfetched.error == "no source delivered"
    # a refused version the runtime does not know is reported failed, with its reason
    assert (refused.name, refused.version, refused.state) == ("big", "7", "failed")
    assert refused.error == "needs 9 GB, the cache holds 1 GB" and refused.reason == "cache_too_small"
