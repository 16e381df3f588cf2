"""Download first, switch together (central, Mosquitto, real edges): a staged rollout has every
selected node fetch and verify the version while it keeps serving the old one; a flip at a set
instant switches them together, each at that instant of central's clock. A node that is down
while the others stage is reported and does not hold the flip up; it switches once it is back
and has staged. A node whose clock offset is unknown is refused the flip."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.cli.rollout import describe
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push, wait_rollout
from support.wait import wait_for

HEARTBEAT = {"enabled": True, "interval_s": 0.3}


@pytest.fixture
async def flip_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    rollout = {"interval_s": 0.2, "flip_lead_s": 1.5}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, rollout=rollout))
    await server.start()
    yield server
    await server.stop()


async def _edge(make_edge: EdgeFactory, node_id: str, central: CentralServer, mosquitto: MosquittoBroker) -> EdgeServer:
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    return await make_edge(node_id, central, heartbeat=HEARTBEAT, broker=broker)


def _serving(edge: EdgeServer) -> str | None:
    """The version of ``tiny`` the edge answers with by default."""
    try:
        return edge.edge.repository.get("tiny").version
    except Exception:
        return None


def _switched_at(edge: EdgeServer, version: str) -> float | None:
    model = next((m for m in edge.edge.repository.models() if (m.name, m.version) == ("tiny", version)), None)
    return model.switched_at if model is not None else None


async def _v1_everywhere_then_v2_stored(
    api: httpx.AsyncClient, tmp_path: Path, central: CentralServer, count: int
) -> None:
    v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=32, hidden_layers=1, seed=1)
    assert (await push(api, "tiny", v1, version="1")).status_code == 201
    await wait_for(lambda: len(central.central.liveness.ready_endpoints("tiny", "1")) == count, 30, "v1 ready")
    response = await push(api, "tiny", v2, version="2", activate="false")
    assert response.status_code == 201, response.text


async def test_staged_nodes_flip_together_and_a_node_down_during_staging_is_reported(
    flip_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edges = [await _edge(make_edge, f"edge-{i}", flip_central, mosquitto) for i in range(3)]
    async with httpx.AsyncClient(base_url=flip_central.http_url, timeout=30) as api:
        await _v1_everywhere_then_v2_stored(api, tmp_path, flip_central, 3)
        await wait_for(lambda: all(e.edge.clock.estimate is not None for e in edges), 10, "clock offsets measured")
        started = await api.post("/api/v1/models/tiny/rollouts", json={"version": "2", "stage": True})
        assert started.status_code == 201, started.text
        assert started.json()["state"] == "staging"
        assert sorted(started.json()["targets"]) == ["edge-0", "edge-1", "edge-2"]
        await edges[2].stop(unregister=False)  # down while the others stage
        staged = await wait_rollout(
            api, "two nodes staged", lambda r: [r["nodes"].get(f"edge-{i}") for i in (0, 1)] == ["staged", "staged"]
        )
        assert staged["nodes"]["edge-2"] == "offline"
        assert "offline: edge-2" in staged["reason"] and "modelfleet flip tiny" in staged["reason"]
        for edge in edges[:2]:  # held whole, verified, not served
            assert _serving(edge) == "1"
            status = {(v["name"], v["version"]): v["state"] for v in edge.edge.status()["versions"]}
            assert status[("tiny", "2")] == "staged"
            assert edge.edge.files.model_path("tiny", "2").is_file()

        flip_at = time.time() + 3.0
        at = datetime.fromtimestamp(flip_at, UTC).isoformat()
        flipped = await api.post("/api/v1/models/tiny/rollout/flip", json={"at": at})
        assert flipped.status_code == 200, flipped.text
        await wait_rollout(api, "flipping", lambda r: r["state"] == "flipping")
        assert all(_serving(e) == "1" for e in edges[:2])  # loaded ahead, not switched yet
        await wait_for(lambda: all(_serving(e) == "2" for e in edges[:2]), 15, "the flip")
        switched = [_switched_at(e, "2") or 0.0 for e in edges[:2]]
        assert all(abs(t - flip_at) < 0.5 for t in switched), (switched, flip_at)
        assert max(switched) - min(switched) < 0.5

        # The rest flipped: the rollout completes, naming the node that was down.
        done = await wait_rollout(api, "complete", lambda r: r["state"] == "complete")
        assert done["nodes"] == {"edge-0": "ready", "edge-1": "ready", "edge-2": "offline"}
        assert "edge-2" not in done["switch_at"] and "offline: edge-2" in done["reason"]
        assert "edge-2: offline" in describe(done).plain

        # The node comes back: it gets the version it missed.
        back = await _edge(make_edge, "edge-2", flip_central, mosquitto)
        await wait_for(lambda: _serving(back) == "2", 20, "edge-2 on version 2")


async def test_a_node_with_an_unknown_clock_is_refused_the_flip(
    flip_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edges = [await _edge(make_edge, f"edge-{i}", flip_central, mosquitto) for i in range(2)]
    async with httpx.AsyncClient(base_url=flip_central.http_url, timeout=30) as api:
        await _v1_everywhere_then_v2_stored(api, tmp_path, flip_central, 2)
        await wait_for(lambda: all(e.edge.clock.estimate is not None for e in edges), 10, "clock offsets measured")
        edges[1].edge.clock.estimate = None  # as if it never measured (an older edge, a failed probe)
        edges[1].edge.clock.interval_s = 3600
        past = {"version": "2", "flip_at": "2001-01-01T00:00:00Z"}
        refused = await api.post("/api/v1/models/tiny/rollouts", json=past)
        assert refused.status_code == 409 and "has passed" in refused.json()["error"]
        body = {"version": "2", "stage": True, "flip_at": datetime.fromtimestamp(time.time() + 4, UTC).isoformat()}
        assert (await api.post("/api/v1/models/tiny/rollouts", json=body)).status_code == 201
        rollout = await wait_rollout(api, "edge-1 refused", lambda r: r["nodes"].get("edge-1") == "refused")
        assert rollout["failures"]["edge-1"]["reason"] == "clock"
        assert "edge-1" not in rollout["switch_at"]
        await wait_for(lambda: _serving(edges[0]) == "2", 15, "edge-0 flipped")
        await asyncio.sleep(1.0)
        assert _serving(edges[1]) == "1"
        # Once it measures its clock it is admitted and switches (late, at once).
        await edges[1].edge.clock.measure(_clock_ask(flip_central, "edge-1"))
        await wait_for(lambda: _serving(edges[1]) == "2", 15, "edge-1 flipped once its clock is known")


def _clock_ask(central: CentralServer, node_id: str) -> Any:
    import grpc

    from fleetwire.v1 import registry_pb2, registry_pb2_grpc

    channel = grpc.aio.insecure_channel(central.grpc_address)
    stub = registry_pb2_grpc.RegistryStub(channel)
    return lambda: stub.Clock(registry_pb2.ClockRequest(node_id=node_id), timeout=2.0)
