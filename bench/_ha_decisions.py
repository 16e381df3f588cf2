"""bench.central_ha's decisions section: the leader of a replicated central is SIGKILLed right
after it decided one of each kind, and the next leader must keep every one
(``decisions_lost_on_leader_kill``, target 0). Also used by the replica fault test.

Its own small fleet (two quantizing replicas, two real edges; the main run's central does not
quantize): a drift classifier is pushed with calibration data, and the leader decides

* an INT8 **fallback**: shifted live traffic on ``e0`` (every request sampled) until central
  falls it back to FP32 (the edge's choice says ``central``);
* a **verdict**: ``e1`` times the artifacts, its choice becomes its class's verdict;
* **caps**: ``PUT /api/v1/transfer`` on the leader;
* **rollout steps**: version 2 started for ``e1``'s label and promoted, on the leader.

Then the leader is killed; once the survivor leads (and has run its passes for a few seconds),
each decision counts as lost unless the survivor still shows it exactly: the fallback in its
agreement report *and* on the edge, the same verdict (the same node and instant, not one heard
anew), the same caps, the rollout at least as far as the leader took it. A decision the new
leader makes again (``int8_drift``, ``rollout_promoted`` in its own journal) is counted too."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench._replicas import ReplicatedFleet, replica_env, wait_until
from modelfleet.up.mosquitto import MosquittoBroker
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo import DRIFT_SHIFT, build_drift_classifier, drift_samples
from modelfleet.zoo.drift import DriftClassifier

__all__ = ["KINDS", "decide_then_kill", "run_decisions"]

KINDS = ("fallbacks", "verdicts", "caps", "rollout_steps")
CAPS = {"fleet": {"fetch_bytes_per_s": 50_000_000}, "nodes": {"e1": {"serve_bytes_per_s": 123_456}}}
#: How long the survivor runs its passes before the decisions are read back.
SETTLE_S = 3.0
_STEPS = {"canary": 1, "rolling": 2, "complete": 2}


def _get(fleet: ReplicatedFleet, replica: str, path: str) -> Any:
    r = fleet.client.get(f"{fleet.replicas[replica].http_url}{path}")
    r.raise_for_status()
    return r.json()


def _events(fleet: ReplicatedFleet, replica: str) -> list[str]:
    return [e["type"] for e in _get(fleet, replica, "/api/v1/events?limit=1000")]


def _choice_source(fleet: ReplicatedFleet, edge: str) -> str | None:
    choice = fleet.edge_status(edge).get("artifacts", {}).get("drift:1") or {}
    return choice.get("source")


def _verdicts(fleet: ReplicatedFleet, replica: str) -> list[dict[str, Any]]:
    """drift:1's verdicts (e1 times version 2 as well once the rollout brings it)."""
    return [v for v in _get(fleet, replica, "/api/v1/verdicts") if v["version"] == "1"]


def _fall_back(fleet: ReplicatedFleet, model: DriftClassifier) -> None:
    """Shifted traffic on e0 until central falls it back to FP32."""
    url = f"{fleet.edges['e0'].http_url}/v2/models/drift/infer"
    sent = 0

    def fell_back() -> bool:
        nonlocal sent
        x, _ = drift_samples(model.prototypes, 10, shift=DRIFT_SHIFT, seed=sent)
        sent += 10
        for row in x:
            body = {"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, row.size],
                                "data": row.tolist()}]}  # fmt: skip
            if fleet.client.post(url, json=body).status_code != 200:
                break  # the edge is switching to FP32 (a 503 meanwhile): look whether it has
        return _choice_source(fleet, "e0") == "central"

    wait_until(fell_back, 60, "e0 on FP32 by central's fallback")


def _roll_out(fleet: ReplicatedFleet, leader: str, model: DriftClassifier) -> None:
    """Version 2 stored, started for e1's label, promoted: each on the leader."""
    base = fleet.replicas[leader].http_url
    files = {"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()}
    stored = fleet.client.post(f"{base}/api/v1/models/drift/versions", params={"version": "2", "activate": "false"},
                               files=files)  # fmt: skip
    stored.raise_for_status()
    started = fleet.client.post(f"{base}/api/v1/models/drift/rollouts",
                                json={"version": "2", "selector": {"ring": "b"}, "soak_s": 3600})  # fmt: skip
    started.raise_for_status()
    fleet.client.post(f"{base}/api/v1/models/drift/rollout/promote").raise_for_status()


def decide_then_kill(fleet: ReplicatedFleet, work: Path) -> dict[str, Any]:
    """On a fleet of running replicas: edges, the decisions, the kill, the read-back. Returns
    ``made`` and ``lost`` per kind, ``redecided`` (events the new leader logged again), the
    leader and the survivor, ``takeover_s`` and ``decisions_lost_on_leader_kill``."""
    model = build_drift_classifier(work / "drift")
    sampled = {"MODELFLEET_INFERENCE__SHADOW_SAMPLE": "1.0"}
    fleet.start_edge("e0", env={**sampled, "MODELFLEET_INFERENCE__CHOICE__ENABLED": "false"})
    fleet.start_edge("e1", env={**sampled, "MODELFLEET_LABELS": '{"ring": "b"}'})  # times: its class's verdict
    fleet.push_files("drift", "1", model.onnx_path, calibration=model.calibration_path)
    fleet.wait_complete("drift", "1", timeout_s=120)
    leader = fleet.leader()
    assert leader is not None, "no leader"

    _fall_back(fleet, model)
    wait_until(lambda: bool(_verdicts(fleet, leader)), 60, "e1's verdict")
    put = fleet.client.put(f"{fleet.replicas[leader].http_url}/api/v1/transfer", json=CAPS)
    put.raise_for_status()
    _roll_out(fleet, leader, model)
    made = {
        "fallbacks": _get(fleet, leader, "/api/v1/models/drift/versions/1/agreement")["fallback_nodes"],
        "verdicts": _verdicts(fleet, leader),
        "caps": put.json(),
        "rollout": _get(fleet, leader, "/api/v1/models/drift/rollout"),
    }
    before = {"int8_drift": _events(fleet, leader).count("int8_drift")}

    killed_at = fleet.kill_replica(leader)
    survivor = fleet.live()[0].name
    wait_until(lambda: fleet.leader() == survivor, 30, "the survivor leads")
    takeover = time.time() - killed_at
    time.sleep(SETTLE_S)
    lost = _lost(fleet, survivor, made)
    events = _events(fleet, survivor)
    redecided = events.count("int8_drift") + events.count("rollout_promoted")
    return {
        "leader": leader,
        "survivor": survivor,
        "takeover_s": round(takeover, 3),
        "made": {k: _count(k, made) for k in KINDS},
        "lost": lost,
        "redecided": redecided,
        "leader_drift_events": before["int8_drift"],
        "decisions_lost_on_leader_kill": sum(lost.values()) + redecided,
    }


def _count(kind: str, made: Mapping[str, Any]) -> int:
    if kind == "caps":
        return _cap_entries(made["caps"])
    if kind == "rollout_steps":
        return _STEPS.get(made["rollout"]["state"], 0)
    return len(made[kind])


def _cap_entries(caps: Mapping[str, Any]) -> int:
    """Caps set (not null) in a policy: the fleet's, each site's, each node's."""
    blocks = [caps.get("fleet") or {}, *(caps.get("sites") or {}).values(), *(caps.get("nodes") or {}).values()]
    return sum(1 for b in blocks for v in b.values() if v is not None)


def _lost(fleet: ReplicatedFleet, survivor: str, made: Mapping[str, Any]) -> dict[str, int]:
    report = _get(fleet, survivor, "/api/v1/models/drift/versions/1/agreement")
    on_fp32 = {"e0"} if _choice_source(fleet, "e0") == "central" else set()
    kept_fallbacks = set(report["fallback_nodes"]) & on_fp32
    verdicts = _verdicts(fleet, survivor)
    caps = _get(fleet, survivor, "/api/v1/transfer")
    rollout = _get(fleet, survivor, "/api/v1/models/drift/rollout")
    same_rollout = rollout["id"] == made["rollout"]["id"]
    steps = _STEPS.get(rollout["state"], 0) if same_rollout else 0
    return {
        "fallbacks": len(set(made["fallbacks"]) - kept_fallbacks),
        "verdicts": sum(1 for v in made["verdicts"] if v not in verdicts),
        "caps": 0 if caps == made["caps"] else _cap_entries(made["caps"]),
        "rollout_steps": max(0, _STEPS.get(made["rollout"]["state"], 0) - steps),
    }


def run_decisions(
    pg: PostgresInstance, s3: S3Server, broker: MosquittoBroker, work: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The section on its own fleet (a fresh database and bucket on the run's servers)."""
    env = {
        **replica_env(
            store_url=pg.fresh_database(),
            blob_env=s3.blob_env(s3.new_bucket()),
            broker=(broker.host, broker.port),
            partitions=8,
            tick_s=0.2,
        ),
        "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": "0.3",
        "MODELFLEET_QUANTIZE__ENABLED": "true",
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_HEARTBEAT__INTERVAL_S": "0.3",
        "MODELFLEET_BROKER__HOST": broker.host,
        "MODELFLEET_BROKER__PORT": str(broker.port),
        "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
    }
    root = work / "decisions"
    root.mkdir(parents=True, exist_ok=True)
    with ReplicatedFleet(root=root, central_env=env, edge_env=edge_env, log=log) as fleet:
        fleet.start_replicas(2)
        wait_until(lambda: fleet.leader() is not None, 30, "a leader")
        section = decide_then_kill(fleet, root)
    log(f"decisions made {section['made']}, lost {section['lost']}, made again {section['redecided']}")
    return section
