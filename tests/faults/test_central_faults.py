"""Central SIGKILLed in the middle of a staged rollout (canary stage), restarted on the same
data dir and ports: the rollout must come back as it was and finish as its plan says."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _faults import CENTRAL_ENV, EDGE_ENV, infer, mqtt_envs, version, wait_until

from bench._fleet import Fleet
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker

WIDTH = 32
#: What a restart must not change about a rollout.
KEPT = ("id", "version", "previous_version", "state", "canary_nodes", "targets")


def _url(fleet: Fleet, path: str) -> str:
    assert fleet.central is not None
    return f"{fleet.central.http_url}/api/v1/models/mlp{path}"


def _rollout(fleet: Fleet) -> dict[str, Any]:
    response = fleet.client.get(_url(fleet, "/rollout"))
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc


def _serving(fleet: Fleet) -> dict[str, str]:
    return {node: str(infer(fleet, node, "mlp", WIDTH)["model_version"]) for node in fleet.edges}


@contextlib.contextmanager
def canary_fleet(
    broker: MosquittoBroker, root: Path, soak_s: float | None = None
) -> Iterator[tuple[Fleet, str, dict[str, Any]]]:
    """Two edges on v1 with heartbeats on ``broker``, a rollout of v2 to half of them in its
    canary stage with the canary serving v2 (promoted by hand, or after ``soak_s`` healthy);
    yields the fleet, the canary and the rollout."""
    mqtt, heartbeat = mqtt_envs(broker)
    v1 = build_mlp(root / "v1.onnx", width=WIDTH, hidden_layers=1)
    v2 = build_mlp(root / "v2.onnx", width=WIDTH, hidden_layers=1, seed=1)
    with Fleet(root=root, central_env={**CENTRAL_ENV, **mqtt}, edge_env={**EDGE_ENV, **heartbeat}) as fleet:
        fleet.start(edges=2)
        fleet.push("mlp", "1", v1)
        wait_until(lambda: all(version(fleet, n, "mlp", "1").get("state") == "complete" for n in fleet.edges), 30, "v1")
        pushed = fleet.client.post(_url(fleet, "/versions"), params={"version": "2", "activate": "false"},
                                   content=v2.read_bytes())  # fmt: skip
        assert pushed.status_code == 201, pushed.text
        started = fleet.client.post(_url(fleet, "/rollouts"), json={"version": "2", "canary": 0.5, "soak_s": soak_s})
        assert started.status_code == 201, started.text
        (canary,) = started.json()["canary_nodes"]
        wait_until(lambda: _rollout(fleet)["nodes"].get(canary) == "ready", 30, "the canary ready on v2")
        before = _rollout(fleet)
        assert before["state"] == "canary"
        assert _serving(fleet) == {n: "2" if n == canary else "1" for n in fleet.edges}
        try:
            yield fleet, canary, before
        finally:
            for proc in fleet.edges.values():  # a frozen edge cannot handle SIGTERM
                if proc.alive():
                    proc.popen.send_signal(signal.SIGCONT)


def _restart_central(fleet: Fleet) -> None:
    http_port, grpc_port = fleet.central_ports()
    fleet.kill_central()
    fleet.start_central(http_port=http_port, grpc_port=grpc_port)


def test_a_rollout_survives_a_central_sigkill_and_ends_where_its_plan_says(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    with canary_fleet(mosquitto, tmp_path) as (fleet, _, before):
        _restart_central(fleet)
        fleet.wait_registered()
        wait_until(lambda: _rollout(fleet)["targets"] == before["targets"], 30, "the rollout's targets back")
        after = _rollout(fleet)
        kept = ("id", "version", "previous_version", "state")
        assert {k: after[k] for k in kept} == {k: before[k] for k in kept}  # the same rollout, same stage

        promoted = fleet.client.post(_url(fleet, "/rollout/promote"))
        assert promoted.status_code == 200, promoted.text
        wait_until(lambda: _rollout(fleet)["state"] == "complete", 30, "the rollout complete")
        wait_until(lambda: set(_serving(fleet).values()) == {"2"}, 30, "every edge on v2")
        events = fleet.events()  # kept on disk: what happened before the kill is still there
        restart = max(i for i, e in enumerate(events) if e["type"] == "central_started")
        nodes_back = {e["node_id"] for e in events[restart:] if e["type"] in ("node_alive", "node_rejoined")}
        assert nodes_back == set(fleet.edges)  # the restarted central saw every edge come back ...
        rollout_events = [(e["type"], e["detail"].get("version")) for e in events if e["type"].startswith("rollout_")]
        assert rollout_events == [  # ... and the whole rollout, across the kill
            ("rollout_started", "2"),
            ("rollout_resumed", "2"),
            ("rollout_promoted", "2"),
            ("rollout_completed", "2"),
        ]
        assert next(e["type"] for e in events[restart:] if e["type"].startswith("rollout_")) == "rollout_resumed"


def test_the_canary_stays_the_canary_when_another_edge_reconnects_first(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    with canary_fleet(mosquitto, tmp_path) as (fleet, canary, before):
        (other,) = set(fleet.edges) - {canary}
        fleet.edges[canary].popen.send_signal(signal.SIGSTOP)  # it reconnects only after the other one
        _restart_central(fleet)
        wait_until(lambda: _rollout(fleet)["targets"] == [other], 30, "the other edge back")
        fleet.edges[canary].popen.send_signal(signal.SIGCONT)
        wait_until(lambda: _rollout(fleet)["targets"] == before["targets"], 30, "both edges back")
        after = _rollout(fleet)
        assert {k: after[k] for k in KEPT} == {k: before[k] for k in KEPT}
        assert _serving(fleet) == {canary: "2", other: "1"}


def test_a_central_frozen_in_the_canary_stage_finishes_the_rollout_and_declares_no_node_dead(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    with canary_fleet(mosquitto, tmp_path, soak_s=2.5) as (fleet, canary, _):
        assert fleet.central is not None
        (other,) = set(fleet.edges) - {canary}
        before = len(fleet.events())
        fleet.central.popen.send_signal(signal.SIGSTOP)  # 3 s: the soak ends while it is frozen
        try:
            frozen_until = time.monotonic() + 3.0
            while time.monotonic() < frozen_until:  # the edges serve on their own, each its version
                assert _serving(fleet) == {canary: "2", other: "1"}
                time.sleep(0.2)
        finally:
            fleet.central.popen.send_signal(signal.SIGCONT)

        wait_until(lambda: _rollout(fleet)["state"] == "complete", 30, "the rollout complete")
        wait_until(lambda: set(_serving(fleet).values()) == {"2"}, 30, "every edge on v2")
        states = {n["node_id"]: n["state"] for n in fleet.membership()["nodes"]}
        assert states == dict.fromkeys(fleet.edges, "alive")
        events = fleet.events()[before:]
        liveness = [(e["node_id"], e["type"]) for e in events if e["type"].startswith("node_")]
        assert liveness == []  # its own freeze is not the nodes' silence
        rollout_events = [(e["type"], e["detail"].get("version")) for e in events if e["type"].startswith("rollout_")]
        assert rollout_events == [("rollout_promoted", "2"), ("rollout_completed", "2")]  # as planned, once each
