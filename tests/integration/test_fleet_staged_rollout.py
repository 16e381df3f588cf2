"""A staged rollout on a real fleet (central, Mosquitto, three edges with labels):
a stored-only version reaches the canary first, everyone selected after the promote,
and a version the edges cannot load is rolled back by itself."""

from __future__ import annotations

from pathlib import Path

import httpx
import onnx
from onnx import TensorProto, helper

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, push, wait_rollout
from support.wait import wait_for


def _unloadable_model(path: Path) -> Path:
    """Valid ONNX (the checker passes it) whose operator no runtime implements, so
    ONNX Runtime refuses to create a session on the edge: a realistic bad release."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 32])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [None, 10])
    node = helper.make_node("FancyHead", ["input"], ["output"], domain="com.example.unreleased")
    graph = helper.make_graph([node], "bad", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example.unreleased", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def _serving(edge: EdgeServer) -> str | None:
    """The version of ``tiny`` the edge answers with by default (None: none)."""
    try:
        return edge.edge.repository.get("tiny").version
    except Exception:
        return None


async def test_canary_promote_and_automatic_rollback_of_a_version_that_fails_to_load(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    zones = {"edge-a1": "a", "edge-a2": "a", "edge-b1": "b"}
    edges = {
        n: await make_edge(n, fleet_central, heartbeat=heartbeat, broker=broker, labels={"zone": z})
        for n, z in zones.items()
    }
    v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=32, hidden_layers=1, seed=1)
    tracker = fleet_central.central.liveness
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        assert (await push(api, "tiny", v1, version="1")).status_code == 201
        await wait_for(lambda: len(tracker.ready_endpoints("tiny", "1")) == 3, 30, "v1 ready on three nodes")
        assert (await push(api, "tiny", v2, version="2", activate="false")).status_code == 201

        body = {"version": "2", "canary": 0.5, "selector": {"zone": "a"}}
        for bad, status in (({**body, "version": "9"}, 404), ({**body, "canary": 0}, 422)):
            response = await api.post("/api/v1/models/tiny/rollouts", json=bad)
            assert response.status_code == status and response.json()["error"], response.text
        response = await api.post("/api/v1/models/tiny/rollouts", json=body)
        assert response.status_code == 201, response.text
        assert (await api.post("/api/v1/models/tiny/rollouts", json=body)).status_code == 409
        assert (await push(api, "tiny", v2, version="2b")).status_code == 409  # a plain push would bypass it
        started = response.json()
        assert started["state"] == "canary" and started["previous_version"] == "1"
        assert started["targets"] == ["edge-a1", "edge-a2"] and len(started["canary_nodes"]) == 1
        (canary,) = started["canary_nodes"]
        rollout = await wait_rollout(api, "healthy canary", lambda r: r["nodes"].get(canary) == "ready")
        assert rollout["reason"] == "canary healthy on 1 node; waiting for a manual promote"
        assert {n: _serving(e) for n, e in edges.items()} == {n: "2" if n == canary else "1" for n in zones}

        assert (await api.post("/api/v1/models/tiny/rollout/promote")).status_code == 200
        rollout = await wait_rollout(api, "complete", lambda r: r["state"] == "complete")
        assert rollout["ready"] == 2 and rollout["failed"] == 0
        await wait_for(lambda: _serving(edges["edge-a1"]) == _serving(edges["edge-a2"]) == "2", 30, "zone a on v2")
        assert _serving(edges["edge-b1"]) == "1"  # outside the selector

        bad = _unloadable_model(tmp_path / "v3.onnx")
        assert (await push(api, "tiny", bad, version="3", activate="false")).status_code == 201
        response = await api.post("/api/v1/models/tiny/rollouts", json={"version": "3", "canary": 1.0})
        assert response.status_code == 201, response.text
        rollout = await wait_rollout(api, "rolled back", lambda r: r["state"] == "rolled_back")
        assert rollout["failed"] >= 1 and "failed on version 3" in rollout["reason"]
        assert "ONNXRuntimeError" in rollout["reason"] or "Fail" in rollout["reason"]
        events = (await api.get("/api/v1/events", params={"limit": 1000})).json()
        kinds = [(e["type"], e["detail"].get("version")) for e in events if e["type"].startswith("rollout_")]
        assert kinds == [
            ("rollout_started", "2"),
            ("rollout_promoted", "2"),
            ("rollout_completed", "2"),
            ("rollout_started", "3"),
            ("rollout_rolled_back", "3"),
        ]
        before = {"edge-a1": "2", "edge-a2": "2", "edge-b1": "1"}
        assert {n: _serving(e) for n, e in edges.items()} == before  # nobody ever switched to 3
        for node, version in before.items():
            await wait_for(
                lambda n=node, v=version: n in dict(tracker.ready_endpoints("tiny", v)), 30, f"{node} on {version}"
            )
