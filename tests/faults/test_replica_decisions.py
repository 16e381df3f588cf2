"""What a replica decides, it decides from shared state: the leader of a replicated central
(real processes, a private PostgreSQL) is SIGKILLed right after it made each kind of decision,
and the next leader keeps every one: an INT8 fallback to FP32 after live drift (no second
flag, the edge stays on FP32), an artifact verdict (the same one, not heard anew), an
operator's transfer caps, and a rollout step (the promotion stands and the rollout completes).

One fleet for all four: the decisions are made, the leader dies once, then each is checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults._faults import CENTRAL_ENV, EDGE_ENV, mqtt_envs, wait_until

from bench._replicas import ReplicatedFleet, replica_env
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo import DRIFT_SHIFT, build_drift_classifier, drift_samples
from modelfleet.zoo.drift import DriftClassifier
from support.brokers import MosquittoBroker

CAPS = {"nodes": {"e1": {"serve_bytes_per_s": 123_456}}}


@pytest.fixture
def fleet(
    tmp_path: Path, postgres: PostgresInstance, s3_server: S3Server, mosquitto: MosquittoBroker
) -> Iterator[ReplicatedFleet]:
    """Two quantizing replicas; the edges report their live INT8 agreement and their choices."""
    central_mqtt, edge_mqtt = mqtt_envs(mosquitto)
    env = replica_env(
        store_url=postgres.fresh_database(),
        blob_env=s3_server.blob_env(s3_server.new_bucket()),
        broker=(mosquitto.host, mosquitto.port),
        partitions=8,
        tick_s=0.2,
    )
    central_env = {**CENTRAL_ENV, **central_mqtt, **env, "MODELFLEET_QUANTIZE__ENABLED": "true"}
    with ReplicatedFleet(root=tmp_path, central_env=central_env, edge_env={**EDGE_ENV, **edge_mqtt}) as f:
        f.start_replicas(2)
        wait_until(lambda: f.leader() is not None, 15, "a leader")
        yield f


def _get(fleet: ReplicatedFleet, path: str, replica: str | None = None) -> Any:
    proc = fleet.replicas[replica] if replica is not None else fleet.central
    assert proc is not None
    r = fleet.client.get(f"{proc.http_url}{path}")
    r.raise_for_status()
    return r.json()


def _choice(fleet: ReplicatedFleet, edge: str, key: str) -> dict[str, Any]:
    return dict(fleet.edge_status(edge).get("artifacts", {}).get(key) or {})


def _verdicts(fleet: ReplicatedFleet, replica: str) -> list[dict[str, Any]]:
    """The verdicts of drift:1 (e1 times version 2 as well once the rollout brings it)."""
    return [v for v in _get(fleet, "/api/v1/verdicts", replica) if v["version"] == "1"]


def _drift(fleet: ReplicatedFleet, model: DriftClassifier, leader: str) -> None:
    """Shifted traffic on e0 until the leader falls it back to FP32."""
    url = f"{fleet.edges['e0'].http_url}/v2/models/drift/infer"
    sent = 0

    def fell_back() -> bool:
        nonlocal sent
        x, _ = drift_samples(model.prototypes, 10, shift=DRIFT_SHIFT, seed=sent)
        sent += 10
        for row in x:
            body = {"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, row.size],
                                "data": row.tolist()}]}  # fmt: skip
            assert fleet.client.post(url, json=body).status_code == 200
        return _choice(fleet, "e0", "drift:1").get("source") == "central"

    wait_until(fell_back, 60, "e0 on FP32 by central's fallback")
    types = [e["type"] for e in _get(fleet, "/api/v1/events?limit=500", leader)]
    assert "int8_fallback" in types, "the leader decided the fallback"


def test_the_next_leader_keeps_every_decision_of_the_killed_one(fleet: ReplicatedFleet, tmp_path: Path) -> None:
    model = build_drift_classifier(tmp_path / "drift")
    edge_env = {"MODELFLEET_INFERENCE__SHADOW_SAMPLE": "1.0"}
    fleet.start_edge("e0", env={**edge_env, "MODELFLEET_INFERENCE__CHOICE__ENABLED": "false"})
    # e1 times the artifacts (its choice is its class's verdict) and is the one a rollout selects
    fleet.start_edge("e1", env={**edge_env, "MODELFLEET_LABELS": '{"ring": "b"}'})
    fleet.push_files("drift", "1", model.onnx_path, calibration=model.calibration_path)
    fleet.wait_complete("drift", "1", timeout_s=90)
    leader = fleet.leader()
    assert leader is not None

    _drift(fleet, model, leader)
    wait_until(lambda: bool(_verdicts(fleet, leader)), 60, "e1's verdict")
    verdicts = _verdicts(fleet, leader)
    put = fleet.client.put(f"{fleet.replicas[leader].http_url}/api/v1/transfer", json=CAPS)
    assert put.status_code == 200, put.text
    caps = put.json()
    stored = fleet.client.post(
        f"{fleet.replicas[leader].http_url}/api/v1/models/drift/versions",
        params={"version": "2", "activate": "false"},
        files={"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()},
    )
    assert stored.status_code == 201, stored.text
    rollout = fleet.client.post(
        f"{fleet.replicas[leader].http_url}/api/v1/models/drift/rollouts",
        json={"version": "2", "selector": {"ring": "b"}, "soak_s": 3600},
    )
    assert rollout.status_code in (200, 201), rollout.text
    promoted = fleet.client.post(f"{fleet.replicas[leader].http_url}/api/v1/models/drift/rollout/promote")
    assert promoted.status_code == 200 and promoted.json()["state"] == "rolling", promoted.text

    fleet.kill_replica(leader)
    survivor = fleet.live()[0].name
    wait_until(lambda: fleet.leader() == survivor, 15, "the survivor leads")

    report = _get(fleet, "/api/v1/models/drift/versions/1/agreement", survivor)
    assert report["fallback_nodes"] == ["e0"], report
    assert _verdicts(fleet, survivor) == verdicts, "the same verdict, not one heard anew"
    assert _get(fleet, "/api/v1/transfer", survivor) == caps
    wait_until(lambda: _get(fleet, "/api/v1/models/drift/rollout", survivor)["state"] == "complete", 60,
               "the promoted rollout completed under the new leader")  # fmt: skip
    assert _choice(fleet, "e0", "drift:1").get("source") == "central", "e0 still on FP32 by the fallback"
    events = [e["type"] for e in _get(fleet, "/api/v1/events?limit=500", survivor)]
    assert "int8_drift" not in events, "the new leader did not decide the fallback again"
    assert "rollout_promoted" not in events, "nor the promotion"
