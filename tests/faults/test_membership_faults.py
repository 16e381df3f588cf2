"""Membership under faults with real processes: central frozen (SIGSTOP) in the middle of a
push and resumed, the broker SIGKILLed in the middle of a burst of heartbeats and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
from _faults import CENTRAL_ENV, EDGE_ENV, infer, mqtt_envs, wait_until
from paho.mqtt.enums import CallbackAPIVersion

from bench._fleet import Fleet
from central.membership.lag_probe import DECAY_PER_S, LagProbe
from fleetwire.mqtt.payloads import Heartbeat, NodeStatus
from fleetwire.mqtt.topics import Topics
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker

WIDTH = 32
INTERVAL_S = 0.3  # the edges' heartbeats: suspect after 0.6 s of silence, dead after 0.9 s
FREEZE_S = 3.0  # a broker hang: 10 of the edges' intervals, 3× their dead_after


def _states(fleet: Fleet) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in fleet.membership()["nodes"]}


def _liveness_events(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["node_id"], e["type"]) for e in events if e["type"] in ("node_suspect", "node_dead", "node_rejoined")]


@contextlib.contextmanager
def serving_fleet(broker: MosquittoBroker, root: Path, edge_env: dict[str, str] | None = None) -> Iterator[Fleet]:
    """Central and two edges heartbeating on ``broker``, both serving mlp v1 and alive."""
    central_mqtt, edge_mqtt = mqtt_envs(broker, INTERVAL_S)
    edges = {**EDGE_ENV, **edge_mqtt, **(edge_env or {})}
    with Fleet(root=root, central_env={**CENTRAL_ENV, **central_mqtt}, edge_env=edges) as fleet:
        fleet.start(edges=2)
        fleet.push("mlp", "1", build_mlp(root / "v1.onnx", width=WIDTH, hidden_layers=1))
        for node in fleet.edges:
            fleet.wait_model_ready(node, "mlp", timeout_s=30)
        wait_until(lambda: _states(fleet) == dict.fromkeys(fleet.edges, "alive"), 30, "both edges alive")
        yield fleet


def _frozen_during_upload(fleet: Fleet, model: Path, freeze_s: float) -> Iterator[bytes]:
    """A push body: half the file, then central frozen for ``freeze_s`` while the edges are
    asked for inference (their own client: the push holds the fleet's), then the rest."""
    assert fleet.central is not None
    central, data = fleet.central.popen, model.read_bytes()
    yield data[: len(data) // 2]
    central.send_signal(signal.SIGSTOP)
    try:
        with httpx.Client(timeout=10) as client:
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, WIDTH], "data": [0.0] * WIDTH}]}
            frozen_until = time.monotonic() + freeze_s
            while time.monotonic() < frozen_until:  # the edges serve on their own
                for node in fleet.edges:
                    answer = client.post(f"{fleet.edges[node].http_url}/v2/models/mlp/infer", json=body)
                    assert answer.status_code == 200 and answer.json()["model_version"] == "1", answer.text
                time.sleep(0.2)
    finally:
        central.send_signal(signal.SIGCONT)
    yield data[len(data) // 2 :]


def test_a_central_frozen_mid_push_leaves_the_edges_serving_declares_no_node_dead_and_finishes_the_push(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    with serving_fleet(mosquitto, tmp_path) as fleet:
        assert fleet.central is not None
        before = len(fleet.events())
        v2 = build_mlp(tmp_path / "v2.onnx", width=WIDTH, hidden_layers=1, seed=1)
        pushed = fleet.client.post(  # frozen 3 s: 10 heartbeat intervals, 3× dead_after
            f"{fleet.central.http_url}/api/v1/models/mlp/versions",
            params={"version": "2"},
            content=_frozen_during_upload(fleet, v2, 3.0),
            headers={"content-length": str(v2.stat().st_size), "content-type": "application/octet-stream"},
        )
        assert pushed.status_code == 201, pushed.text  # acknowledged once central runs again ...
        for node in fleet.edges:  # ... and delivered: the desired-state streams survived the freeze
            wait_until(lambda n=node: infer(fleet, n, "mlp", WIDTH)["model_version"] == "2", 30, f"{node} on v2")

        wait_until(lambda: _states(fleet) == dict.fromkeys(fleet.edges, "alive"), 15, "both edges alive")
        time.sleep(1.0)  # several intervals after the thaw: no late verdict from the frozen time
        assert _states(fleet) == dict.fromkeys(fleet.edges, "alive")
        assert _liveness_events(fleet.events()[before:]) == []  # its own freeze is not the nodes' silence


class HeartbeatBurst:
    """``count`` synthetic nodes, each announcing itself and then heartbeating every 0.1 s
    (5× faster than the 0.5 s interval it declares) from a thread, reconnecting on its own."""

    def __init__(self, broker: MosquittoBroker, count: int) -> None:
        self.topics = Topics()
        self.nodes = [f"burst-{i:03d}" for i in range(count)]
        self.sent = 0
        self._stop = threading.Event()
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="fault-burst")
        self._client.reconnect_delay_set(0.1, 0.5)
        self._client.on_connect = lambda *_: self._announce()
        self._client.connect(broker.host, broker.port, keepalive=5)
        self._thread = threading.Thread(target=self._run, name="heartbeat-burst", daemon=True)

    def _announce(self) -> None:
        for node in self.nodes:
            birth = NodeStatus(state="online", bdseq=1, ts=int(time.time() * 1000)).model_dump_json()
            self._client.publish(self.topics.node_status(node), birth, qos=1)

    def _run(self) -> None:
        seq = 0
        while not self._stop.wait(0.1):
            seq += 1
            for node in self.nodes:
                hb = Heartbeat(node_id=node, bdseq=1, seq=seq, ts=int(time.time() * 1000), interval_s=0.5)
                if self._client.publish(self.topics.node_heartbeat(node), hb.model_dump_json()).rc == 0:
                    self.sent += 1

    def __enter__(self) -> HeartbeatBurst:
        self._client.loop_start()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.disconnect()
        self._client.loop_stop()


def test_a_broker_killed_during_a_heartbeat_burst_comes_back_with_every_node_alive(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    with serving_fleet(mosquitto, tmp_path) as fleet, HeartbeatBurst(mosquitto, 40) as burst:
        everyone = dict.fromkeys([*fleet.edges, *burst.nodes], "alive")
        wait_until(lambda: _states(fleet) == everyone, 30, "the burst's nodes alive")
        before = len(fleet.events())
        sent = burst.sent
        wait_until(lambda: burst.sent >= sent + 200, 10, "the burst under way")
        mosquitto.kill()  # ~400 messages a second in flight
        time.sleep(1.0)  # longer than dead_after × the edges' interval: nothing is heard meanwhile
        assert _states(fleet) == everyone  # the tracker froze while the link was down
        mosquitto.start()

        wait_until(lambda: _states(fleet) == everyone, 30, "every node alive again")
        assert fleet.central is not None and fleet.central.alive()
        time.sleep(1.5)  # settled: still all alive
        assert _states(fleet) == everyone
        events = fleet.events()[before:]
        for node, kind in _liveness_events(events):  # allowed, if every one came back (row 16)
            if kind == "node_dead":
                assert (node, "node_rejoined") in _liveness_events(events), events
        assert {infer(fleet, node, "mlp", WIDTH)["model_version"] for node in fleet.edges} == {"1"}


def test_a_broker_frozen_during_a_heartbeat_burst_declares_no_node_dead(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    # The edges' MQTT keep-alive (5 s) outlasts the freeze: with the default (2 s at a 0.3 s
    # interval) paho drops the link 2-4 s into a hang and the broker publishes its will on
    # SIGCONT, a real disconnection (docs/reliability.md, row 25).
    keepalive = {"MODELFLEET_BROKER__KEEPALIVE_S": "5"}
    with serving_fleet(mosquitto, tmp_path, keepalive) as fleet, HeartbeatBurst(mosquitto, 40) as burst:
        everyone = dict.fromkeys([*fleet.edges, *burst.nodes], "alive")
        wait_until(lambda: _states(fleet) == everyone, 30, "the burst's nodes alive")
        before = len(fleet.events())
        sent = burst.sent
        wait_until(lambda: burst.sent >= sent + 200, 10, "the burst under way")
        mosquitto.pause()  # sockets open, nothing read or sent: 10 of the edges' intervals
        try:
            frozen_until = time.monotonic() + FREEZE_S
            while time.monotonic() < frozen_until:  # central, behind its own feed, convicts nobody
                assert _states(fleet) == everyone
                time.sleep(0.2)
        finally:
            mosquitto.resume()

        settled_at = time.monotonic() + 2.5  # the backlog drained and the lag falling: nobody convicted
        while time.monotonic() < settled_at:
            assert _states(fleet) == everyone
            time.sleep(0.2)
        assert _liveness_events(fleet.events()[before:]) == []
        assert fleet.central is not None and fleet.central.alive()
        assert {infer(fleet, node, "mlp", WIDTH)["model_version"] for node in fleet.edges} == {"1"}


async def test_probes_a_hung_broker_returns_in_one_batch_leave_a_lag_that_falls_slowly() -> None:
    """The lag known when probes come back falls at DECAY_PER_S, never at once: heartbeats
    read meanwhile were credited "now minus the lag" (row 25's first runs saw a suspect)."""
    probe = LagProbe(lambda _: True, every_s=0.1)
    probe.connected(asyncio.get_running_loop())
    await asyncio.sleep(0.55)  # the broker holds every probe: ~6 outstanding
    assert probe.lag() >= 0.5
    for seq in range(1, probe.probes_sent + 1):  # it resumes and returns them all at once
        probe.handle(str(seq).encode())
    assert probe.probes_returned == probe.probes_sent
    assert probe.lag() >= 0.5  # not the near-zero round trip of the newest one
    await asyncio.sleep(0.4)  # probes keep coming back at once now (none is handled here) ...
    for seq in range(probe.probes_returned + 1, probe.probes_sent + 1):
        probe.handle(str(seq).encode())
    assert 0.5 - 0.4 * DECAY_PER_S - 0.1 <= probe.lag() <= 0.7  # ... the lag falls at its pace
    probe.disconnected()
