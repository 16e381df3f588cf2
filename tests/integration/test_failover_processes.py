"""Failover with real processes and a real broker: edges killed (SIGKILL) or frozen
(SIGSTOP), the broker and central killed and restarted.

The module runs one private Mosquitto, one central and three edges as subprocesses
(``bench._fleet.Fleet``), pushes the digits classifier with its calibration (central
serves it INT8) in small chunks, and waits until every edge serves it and central's
membership lists all three alive with the model ready. Starting that took most of each
test's time, so the tests share it: before each one, ``fleet`` brings back whatever the
previous test killed, froze or stopped (broker, central on its ports, edges on their own
dirs) and waits for that same state, and each test reads only the events after its
start. ``Fleet`` stops every process when the module ends; frozen edges are resumed
first.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench._fleet import Fleet
from bench.failover import CHUNKING_ENV, StreamClient, chunk_ownership, oip_bodies, wait_membership_ready
from fleetwire.manifest import Manifest
from modelfleet.zoo import DigitsModel, build_digits
from support.brokers import MosquittoBroker

MODEL = "digits"
EDGES = ("e0", "e1", "e2")


@pytest.fixture(scope="module")
def digits() -> DigitsModel:
    return build_digits()


@contextlib.contextmanager
def running_fleet(
    broker: MosquittoBroker, root: Path, digits: DigitsModel, interval: float = 0.5
) -> Iterator[tuple[Fleet, int]]:
    """Central and three edges on ``broker``, digits pushed and served everywhere;
    yields the fleet and the number of unique chunks of the version."""
    central_env = {
        "MODELFLEET_MQTT__ENABLED": "true",
        "MODELFLEET_BROKER__HOST": broker.host,
        "MODELFLEET_BROKER__PORT": str(broker.port),
        "MODELFLEET_BROKER__RECONNECT_MAX_S": "1.0",
        **CHUNKING_ENV,
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_BROKER__HOST": broker.host,
        "MODELFLEET_BROKER__PORT": str(broker.port),
        "MODELFLEET_HEARTBEAT__INTERVAL_S": str(interval),
        "MODELFLEET_BROKER__RECONNECT_MAX_S": "1.0",
        "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
    }
    with Fleet(root=root, central_env=central_env, edge_env=edge_env) as fleet:
        fleet.start(edges=len(EDGES))
        pushed = fleet.push_files(MODEL, "v1", digits.onnx_path, calibration=digits.calibration_path)
        chunks = len(Manifest.model_validate(pushed.manifest).unique_chunks())  # every artifact's, as placed
        assert chunks >= 4, pushed.manifest
        for node in fleet.edges:
            fleet.wait_model_ready(node, MODEL, timeout_s=60)
        wait_membership_ready(fleet, set(EDGES), MODEL, 30)
        try:
            yield fleet, chunks
        finally:
            for proc in fleet.edges.values():  # a frozen edge cannot handle SIGTERM
                if proc.alive():
                    proc.popen.send_signal(signal.SIGCONT)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def now_ms() -> int:
    """Wall clock in ms, as central stamps events (``ts``; same host)."""
    return int(time.time() * 1000)


def events_of(
    fleet: Fleet, node_id: str | None = None, kind: str | None = None, *, since_ms: int
) -> list[dict[str, Any]]:
    """Central's events stamped at or after ``since_ms`` (the shared fleet's earlier tests
    left theirs in the log), for one node and of one kind when given."""
    return [
        e
        for e in fleet.events()
        if e["ts"] >= since_ms and (node_id is None or e["node_id"] == node_id) and (kind is None or e["type"] == kind)
    ]


@dataclass(frozen=True)
class Shared:
    """The module's broker and fleet, the number of unique chunks of the version, and
    central's ports (a restarted central gets them again)."""

    broker: MosquittoBroker
    fleet: Fleet
    chunks: int
    central_ports: tuple[int, int]


@dataclass(frozen=True)
class Healthy:
    """The shared fleet in the state a fresh one starts in, and when the test began."""

    broker: MosquittoBroker
    fleet: Fleet
    chunks: int
    since_ms: int


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, digits: DigitsModel) -> Iterator[Shared]:
    with MosquittoBroker() as broker, running_fleet(broker, tmp_path_factory.mktemp("failover"), digits) as running:
        fleet, chunks = running
        yield Shared(broker, fleet, chunks, fleet.central_ports())


@pytest.fixture
def fleet(shared: Shared) -> Healthy:
    """The shared fleet with every process running again (what the last test killed is
    restarted, what it froze resumed), all three edges alive on the ring and serving."""
    broker, fleet = shared.broker, shared.fleet
    if not broker.running:
        broker.start()
    if fleet.central is None or not fleet.central.alive():
        http_port, grpc_port = shared.central_ports
        fleet.start_central(http_port=http_port, grpc_port=grpc_port)
    for node_id, proc in fleet.edges.items():
        if proc.alive():
            proc.popen.send_signal(signal.SIGCONT)
        else:
            fleet.start_edge(node_id)
    wait_until(lambda: states(fleet) == dict.fromkeys(EDGES, "alive") and ring(fleet) == set(EDGES), 30, "all alive")
    for node_id in EDGES:
        fleet.wait_model_ready(node_id, MODEL, timeout_s=30)
    wait_membership_ready(fleet, set(EDGES), MODEL, 30)
    wait_until(lambda: chunk_ownership(fleet, shared.chunks, set())["ok"], 15, "every chunk owned")
    return Healthy(broker, fleet, shared.chunks, now_ms())


def states(fleet: Fleet) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in fleet.membership()["nodes"]}


def ring(fleet: Fleet) -> set[str]:
    return {n["node_id"] for n in fleet.nodes()}


def kill_edge(fleet: Fleet, node_id: str) -> None:
    proc = fleet.edges[node_id]
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(timeout=10)


def infer_ok(fleet: Fleet, body: bytes) -> bool:
    assert fleet.central is not None
    try:
        r = fleet.client.post(
            f"{fleet.central.http_url}/v2/models/{MODEL}/infer",
            content=body,
            headers={"content-type": "application/json"},
            timeout=15,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and "outputs" in r.json()


def test_killed_edge_dies_by_last_will_and_rejoins_after_restart(fleet: Healthy) -> None:
    running, chunks, since = fleet.fleet, fleet.chunks, fleet.since_ms
    assert chunk_ownership(running, chunks, set())["ok"]
    kill_edge(running, "e0")
    wait_until(lambda: bool(events_of(running, "e0", "node_dead", since_ms=since)), 20, "e0 declared dead")
    dead = events_of(running, "e0", "node_dead", since_ms=since)
    assert [e["detail"]["reason"] for e in dead] == ["last will"], dead
    assert states(running) == {"e0": "dead", "e1": "alive", "e2": "alive"}
    wait_until(lambda: "e0" not in ring(running), 15, "e0 leaving the ring")
    wait_until(lambda: chunk_ownership(running, chunks, {"e0"})["ok"], 15, "chunks re-owned")
    owned = chunk_ownership(running, chunks, {"e0"})
    assert owned["owned_chunks"] == {"e1": chunks, "e2": chunks}, owned

    running.start_edge("e0")  # same data and cache dirs
    wait_until(lambda: bool(events_of(running, "e0", "node_rejoined", since_ms=since)), 20, "e0 rejoining")
    wait_until(lambda: states(running).get("e0") == "alive" and "e0" in ring(running), 20, "e0 alive on the ring")
    running.wait_model_ready("e0", MODEL, timeout_s=30)
    wait_membership_ready(running, set(EDGES), MODEL, 20)
    assert chunk_ownership(running, chunks, set())["ok"]
    assert fleet.broker.running


def test_gateway_clients_see_no_failure_when_an_edge_is_killed(fleet: Healthy, digits: DigitsModel) -> None:
    running = fleet.fleet
    assert running.central is not None
    client = StreamClient(
        f"{running.central.http_url}/v2/models/{MODEL}/infer", oip_bodies(digits.test_x, digits.input_name), 3
    )
    client.start()
    try:
        time.sleep(1.5)
        kill_edge(running, "e1")
        wait_until(lambda: bool(events_of(running, "e1", "node_dead", since_ms=fleet.since_ms)), 20, "e1 dead")
        time.sleep(1.5)
    finally:
        client.stop()
    results = client.snapshot()
    failed = [(r.status, r.error) for r in results if r.status != 200]
    assert not failed, failed[:5]
    assert len(results) > 30
    served = {r.node for r in results}
    assert "e1" in served and {"e0", "e2"} <= served
    last = max(r.end for r in results if r.node == "e1")
    assert all(r.node != "e1" for r in results if r.start > last)


def test_frozen_edge_goes_suspect_then_dead_and_rejoins_when_resumed(fleet: Healthy, digits: DigitsModel) -> None:
    running, since = fleet.fleet, fleet.since_ms
    proc = running.edges["e2"]
    proc.popen.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: bool(events_of(running, "e2", "node_dead", since_ms=since)), 20, "e2 declared dead")
        kinds = [e["type"] for e in events_of(running, "e2", since_ms=since)]
        assert kinds == ["node_suspect", "node_dead"], kinds  # from alive (the fixture's state), nothing between
        assert events_of(running, "e2", "node_suspect", since_ms=since)[0]["detail"]["reason"] == "heartbeat timeout"
        wait_until(lambda: "e2" not in ring(running), 15, "e2 leaving the ring")
        assert chunk_ownership(running, fleet.chunks, {"e2"})["ok"]
        assert infer_ok(running, oip_bodies(digits.test_x, digits.input_name, 1)[0])
    finally:
        proc.popen.send_signal(signal.SIGCONT)
    wait_until(lambda: bool(events_of(running, "e2", "node_rejoined", since_ms=since)), 15, "e2 rejoining")
    wait_until(lambda: states(running).get("e2") == "alive" and "e2" in ring(running), 15, "e2 alive on the ring")
    # It stays alive: a Last Will of the frozen session arriving late must not kill it again
    # for good (a new session's birth would revive it, but it must end up alive).
    time.sleep(2.0)
    wait_until(lambda: states(running) == dict.fromkeys(EDGES, "alive"), 20, "all alive")
    wait_membership_ready(running, set(EDGES), MODEL, 15)


def test_broker_outage_converges_back_to_all_alive(fleet: Healthy, digits: DigitsModel) -> None:
    running, broker = fleet.fleet, fleet.broker
    before = now_ms()
    broker.kill()
    time.sleep(2.0)  # longer than dead_after × interval (1.5 s): nothing is heard meanwhile
    assert states(running) == dict.fromkeys(EDGES, "alive"), "the tracker must freeze while the link is down"
    broker.start()
    wait_until(lambda: states(running) == dict.fromkeys(EDGES, "alive"), 30, "all alive again")
    wait_membership_ready(running, set(EDGES), MODEL, 30)
    body = oip_bodies(digits.test_x, digits.input_name, 1)[0]
    wait_until(lambda: infer_ok(running, body), 15, "the gateway serving again")
    time.sleep(2.0)  # settled: still all alive, and on the ring
    assert states(running) == dict.fromkeys(EDGES, "alive")
    assert ring(running) == set(EDGES)
    after = events_of(running, since_ms=before)
    dead = [e for e in after if e["type"] == "node_dead"]
    for e in dead:  # allowed, if every one came back
        assert any(a["type"] == "node_rejoined" and a["node_id"] == e["node_id"] for a in after), after


def test_central_restart_declares_no_live_node_dead(fleet: Healthy, digits: DigitsModel) -> None:
    running = fleet.fleet
    http_port, grpc_port = running.central_ports()
    running.kill_central()
    time.sleep(1.0)
    running.start_central(http_port=http_port, grpc_port=grpc_port)
    assert running.central_ports() == (http_port, grpc_port)
    wait_until(lambda: ring(running) == set(EDGES), 30, "edges re-registering")
    wait_until(lambda: states(running) == dict.fromkeys(EDGES, "alive"), 15, "all alive")
    wait_membership_ready(running, set(EDGES), MODEL, 15)
    time.sleep(2.5)  # past the restart's grace window (suspect_after/dead_after × interval)
    assert states(running) == dict.fromkeys(EDGES, "alive")
    events = events_of(running, since_ms=fleet.since_ms)
    assert [e["type"] for e in events].count("central_started") == 1, events  # the window holds the restart
    assert not [e for e in events if e["type"] in ("node_dead", "node_suspect")], events
    assert infer_ok(running, oip_bodies(digits.test_x, digits.input_name, 1)[0])
