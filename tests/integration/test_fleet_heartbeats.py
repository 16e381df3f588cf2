"""Heartbeats through a real Mosquitto: central learns which edges are alive and
what they serve, routes the gateway by it, and re-places a departed node's chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker))
    await server.start()
    yield server
    await server.stop()


def _heartbeat(broker: MosquittoBroker) -> dict[str, object]:
    """Edge settings overrides: heartbeats every 0.3 s through ``broker``."""
    return {"heartbeat": {"enabled": True, "interval_s": 0.3}, "broker": {"host": broker.host, "port": broker.port}}


def _alive(central: CentralServer) -> set[str]:
    return {v.node_id for v in central.central.liveness.nodes() if str(v.state) == "alive"}


async def test_gateway_routes_by_heartbeats_and_a_leaving_node_loses_its_chunks(
    mqtt_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edges = [await make_edge(f"edge-{i}", mqtt_central, **_heartbeat(mosquitto)) for i in range(3)]
    await wait_for(lambda: _alive(mqtt_central) == {e.node_id for e in edges}, 20, "three alive nodes")
    async with httpx.AsyncClient(base_url=mqtt_central.http_url, timeout=30) as api:
        assert (await push(api, "tiny", small_model_file)).status_code == 201
        tracker = mqtt_central.central.liveness
        await wait_for(lambda: len(tracker.ready_endpoints("tiny")) == 3, 30, "tiny ready in heartbeats")

        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}
        served_by = set()
        for _ in range(12):
            response = await api.post("/v2/models/tiny/infer", json=body)
            assert response.status_code == 200, response.text
            served_by.add(response.headers["X-Modelfleet-Node"])
        assert len(served_by) >= 2  # spread over the fleet

        leaver = edges[0]
        await leaver.stop()  # publishes "offline" with its bdseq first
        await wait_for(lambda: str(tracker.state_of(leaver.node_id)) == "dead", 10, "the leaver marked dead")
        events = (await api.get("/api/v1/events")).json()
        assert any(e["type"] == "node_dead" and e["node_id"] == leaver.node_id for e in events)

        placement = mqtt_central.central.placement.placement(("tiny", "1"))
        live = {e.node_id for e in edges[1:]}
        assert placement and all(len(o) == 2 and set(o) <= live for o in placement.values())
        for _ in range(6):
            response = await api.post("/v2/models/tiny/infer", json=body)
            assert response.status_code == 200 and response.headers["X-Modelfleet-Node"] != leaver.node_id
        membership = (await api.get("/api/v1/membership")).json()
        assert membership["counts"]["alive"] == 2


async def test_no_node_can_serve_gives_503_naming_the_model(
    mqtt_central: CentralServer, small_model_file: Path
) -> None:
    async with httpx.AsyncClient(base_url=mqtt_central.http_url) as api:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
        assert (await push(api, "lonely", small_model_file)).status_code == 201  # known, on no node
        response = await api.post("/v2/models/lonely/infer", json=body)
        assert response.status_code == 503 and "lonely" in response.json()["error"]
        response = await api.post("/v2/models/ghost/infer", json=body)  # never pushed
        assert response.status_code == 404 and "ghost" in response.json()["error"]


async def test_central_and_edges_reconverge_after_the_broker_restarts(
    mqtt_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory
) -> None:
    edges = [await make_edge(f"edge-{i}", mqtt_central, **_heartbeat(mosquitto)) for i in range(2)]
    names = {e.node_id for e in edges}
    await wait_for(lambda: _alive(mqtt_central) == names, 20, "two alive nodes")
    mosquitto.kill()
    mosquitto.restart()
    await wait_for(lambda: all(e.edge.heartbeat.bdseq >= 2 for e in edges), 30, "edges reconnected with a new bdseq")
    await wait_for(lambda: _alive(mqtt_central) == names, 30, "both alive again at central")
    assert {n.node_id for n in mqtt_central.central.directory.nodes()} == names
