"""Failover with real processes and a real broker: edges killed (SIGKILL) or frozen
(SIGSTOP), the broker and central killed and restarted.

Every test runs a private Mosquitto (the ``mosquitto`` fixture), a central and three
edges as subprocesses (``bench._fleet.Fleet``), pushes the digits classifier with its
calibration (central serves it INT8) in small chunks, and waits until every edge serves
it and central's membership lists all three alive with the model ready. ``Fleet``
stops every process when its ``with`` block ends; frozen edges are resumed in
``finally`` first.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench._fleet import Fleet
from bench.failover import CHUNKING_ENV, StreamClient, chunk_ownership, oip_bodies, wait_membership_ready
from brokers import MosquittoBroker
from modelfleet.zoo import DigitsModel, build_digits

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
        "MODELFLEET_MQTT__HOST": broker.host,
        "MODELFLEET_MQTT__PORT": str(broker.port),
        "MODELFLEET_MQTT__RECONNECT_MAX_S": "1.0",
        **CHUNKING_ENV,
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_HEARTBEAT__BROKER_HOST": broker.host,
        "MODELFLEET_HEARTBEAT__BROKER_PORT": str(broker.port),
        "MODELFLEET_HEARTBEAT__INTERVAL_S": str(interval),
        "MODELFLEET_HEARTBEAT__RECONNECT_MAX_S": "1.0",
        "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
    }
    with Fleet(root=root, central_env=central_env, edge_env=edge_env) as fleet:
        fleet.start(edges=len(EDGES))
        pushed = fleet.push_files(MODEL, "v1", digits.onnx_path, calibration=digits.calibration_path)
        chunks = len({c["digest"] for c in pushed.manifest["chunks"]})
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


def events_of(fleet: Fleet, node_id: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in fleet.events()
        if (node_id is None or e["node_id"] == node_id) and (kind is None or e["type"] == kind)
    ]


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


def test_killed_edge_dies_by_last_will_and_rejoins_after_restart(
    mosquitto: MosquittoBroker, tmp_path: Path, digits: DigitsModel
) -> None:
    with running_fleet(mosquitto, tmp_path, digits, interval=1.0) as (fleet, chunks):
        assert chunk_ownership(fleet, chunks, set())["ok"]
        kill_edge(fleet, "e0")
        wait_until(lambda: bool(events_of(fleet, "e0", "node_dead")), 20, "e0 declared dead")
        dead = events_of(fleet, "e0", "node_dead")
        assert [e["detail"]["reason"] for e in dead] == ["last will"], dead
        assert states(fleet) == {"e0": "dead", "e1": "alive", "e2": "alive"}
        wait_until(lambda: "e0" not in ring(fleet), 15, "e0 leaving the ring")
        wait_until(lambda: chunk_ownership(fleet, chunks, {"e0"})["ok"], 15, "chunks re-owned")
        owned = chunk_ownership(fleet, chunks, {"e0"})
        assert owned["owned_chunks"] == {"e1": chunks, "e2": chunks}, owned

        fleet.start_edge("e0")  # same data and cache dirs
        wait_until(lambda: bool(events_of(fleet, "e0", "node_rejoined")), 20, "e0 rejoining")
        wait_until(lambda: states(fleet).get("e0") == "alive" and "e0" in ring(fleet), 20, "e0 alive on the ring")
        fleet.wait_model_ready("e0", MODEL, timeout_s=30)
        wait_membership_ready(fleet, set(EDGES), MODEL, 20)
        assert chunk_ownership(fleet, chunks, set())["ok"]
        assert mosquitto.running


def test_gateway_clients_see_no_failure_when_an_edge_is_killed(
    mosquitto: MosquittoBroker, tmp_path: Path, digits: DigitsModel
) -> None:
    with running_fleet(mosquitto, tmp_path, digits) as (fleet, _):
        assert fleet.central is not None
        client = StreamClient(
            f"{fleet.central.http_url}/v2/models/{MODEL}/infer", oip_bodies(digits.test_x, digits.input_name), 3
        )
        client.start()
        try:
            time.sleep(1.5)
            kill_edge(fleet, "e1")
            wait_until(lambda: bool(events_of(fleet, "e1", "node_dead")), 20, "e1 declared dead")
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


def test_frozen_edge_goes_suspect_then_dead_and_rejoins_when_resumed(
    mosquitto: MosquittoBroker, tmp_path: Path, digits: DigitsModel
) -> None:
    with running_fleet(mosquitto, tmp_path, digits) as (fleet, chunks):
        proc = fleet.edges["e2"]
        proc.popen.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: bool(events_of(fleet, "e2", "node_dead")), 20, "e2 declared dead")
            kinds = [e["type"] for e in events_of(fleet, "e2")]
            assert kinds == ["node_alive", "node_suspect", "node_dead"], kinds
            assert events_of(fleet, "e2", "node_suspect")[0]["detail"]["reason"] == "heartbeat timeout"
            wait_until(lambda: "e2" not in ring(fleet), 15, "e2 leaving the ring")
            assert chunk_ownership(fleet, chunks, {"e2"})["ok"]
            assert infer_ok(fleet, oip_bodies(digits.test_x, digits.input_name, 1)[0])
        finally:
            proc.popen.send_signal(signal.SIGCONT)
        wait_until(lambda: bool(events_of(fleet, "e2", "node_rejoined")), 15, "e2 rejoining")
        wait_until(lambda: states(fleet).get("e2") == "alive" and "e2" in ring(fleet), 15, "e2 alive on the ring")
        # It stays alive: a Last Will of the frozen session arriving late must not kill it again
        # for good (a new session's birth would revive it, but it must end up alive).
        time.sleep(2.0)
        wait_until(lambda: states(fleet) == dict.fromkeys(EDGES, "alive"), 20, "all alive")
        wait_membership_ready(fleet, set(EDGES), MODEL, 15)


def test_broker_outage_converges_back_to_all_alive(
    mosquitto: MosquittoBroker, tmp_path: Path, digits: DigitsModel
) -> None:
    with running_fleet(mosquitto, tmp_path, digits) as (fleet, _):
        before = len(fleet.events())
        mosquitto.kill()
        time.sleep(2.0)  # longer than dead_after × interval (1.5 s): nothing is heard meanwhile
        assert states(fleet) == dict.fromkeys(EDGES, "alive"), "the tracker must freeze while the link is down"
        mosquitto.start()
        wait_until(lambda: states(fleet) == dict.fromkeys(EDGES, "alive"), 30, "all alive again")
        wait_membership_ready(fleet, set(EDGES), MODEL, 30)
        body = oip_bodies(digits.test_x, digits.input_name, 1)[0]
        wait_until(lambda: infer_ok(fleet, body), 15, "the gateway serving again")
        time.sleep(2.0)  # settled: still all alive, and on the ring
        assert states(fleet) == dict.fromkeys(EDGES, "alive")
        assert ring(fleet) == set(EDGES)
        after = fleet.events()[before:]
        dead = [e for e in after if e["type"] == "node_dead"]
        for e in dead:  # allowed, if every one came back
            assert any(a["type"] == "node_rejoined" and a["node_id"] == e["node_id"] for a in after), after


def test_central_restart_declares_no_live_node_dead(
    mosquitto: MosquittoBroker, tmp_path: Path, digits: DigitsModel
) -> None:
    with running_fleet(mosquitto, tmp_path, digits) as (fleet, _):
        http_port, grpc_port = fleet.central_ports()
        fleet.kill_central()
        time.sleep(1.0)
        fleet.start_central(http_port=http_port, grpc_port=grpc_port)
        assert fleet.central_ports() == (http_port, grpc_port)
        wait_until(lambda: ring(fleet) == set(EDGES), 30, "edges re-registering")
        wait_until(lambda: states(fleet) == dict.fromkeys(EDGES, "alive"), 15, "all alive")
        wait_membership_ready(fleet, set(EDGES), MODEL, 15)
        time.sleep(2.5)  # past the restart's grace window (suspect_after/dead_after × interval)
        assert states(fleet) == dict.fromkeys(EDGES, "alive")
        events = fleet.events()
        assert not [e for e in events if e["type"] in ("node_dead", "node_suspect")], events
        assert infer_ok(fleet, oip_bodies(digits.test_x, digits.input_name, 1)[0])
