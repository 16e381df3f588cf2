"""A stolen edge steering the fleet (issue 24, holes 1, 5 and 7): a real central, a real Mosquitto
and real edges; the test acts as the stolen edge-1 with edge-1's own credentials — it publishes
MQTT messages on edge-1's topics (all edge-1's login may publish under the shipped ACL) and calls
central's gRPC Registry as edge-1. What central believes of those messages must stay about
edge-1: never another node, never the fleet."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from brokers import MosquittoBroker
from central.server import CentralServer
from conftest import EdgeFactory, central_settings, wait_for
from edge_node.server import EdgeServer
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, Heartbeat, ModelInfo, ShadowInfo
from fleetwire.mqtt.topics import Topics
from modelfleet.zoo import build_drift_classifier, drift_samples


class StolenLogin:
    """The MQTT side of a stolen edge: publishes heartbeats on its node's own topic."""

    def __init__(self, broker: MosquittoBroker, node_id: str, bdseq: int = 7) -> None:
        self.node_id = node_id
        self.bdseq = bdseq
        self.seq = 0
        self.topics = Topics()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"stolen-{uuid.uuid4().hex[:8]}")
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()

    def beat(self, **fields: Any) -> None:
        """One heartbeat of ``node_id`` with ``fields`` (models, addresses, ...)."""
        self.seq += 1
        hb = Heartbeat(
            node_id=self.node_id, bdseq=self.bdseq, seq=self.seq, ts=int(time.time() * 1000), interval_s=0.3,
            **fields,
        )  # fmt: skip
        info = self.client.publish(self.topics.node_heartbeat(self.node_id), hb.model_dump_json(), qos=1)
        info.wait_for_publish(5)

    async def beat_for(self, seconds: float, **fields: Any) -> None:
        """Heartbeats every 0.3 s for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.beat(**fields)
            await asyncio.sleep(0.3)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
async def quantizing_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt_settings = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(
        central_settings(tmp_path / "central", mqtt=mqtt_settings, broker=broker, quantize={"enabled": True})
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stolen(mosquitto: MosquittoBroker) -> AsyncIterator[StolenLogin]:
    login = StolenLogin(mosquitto, "edge-1")
    yield login
    login.close()


def _served(edge: EdgeServer, model: str) -> str:
    return edge.edge.repository.get(model).artifact


async def _events(api: httpx.AsyncClient, kind: str) -> list[dict[str, Any]]:
    response = await api.get("/api/v1/events")
    assert response.status_code == 200
    body = response.json()
    events = body["events"] if isinstance(body, dict) else body
    return [e for e in events if e["type"] == kind]


async def test_forged_live_disagreement_from_one_edge_falls_back_only_that_edge(
    quantizing_central: CentralServer,
    mosquitto: MosquittoBroker,
    make_edge: EdgeFactory,
    stolen: StolenLogin,
    tmp_path: Path,
) -> None:
    """Hole 1: edge-1's login reports invented shadow counts (2,000 samples, none agreeing) for
    the INT8 artifact; edge-2 has 24/24 real agreement. Only edge-1 may be flagged and fall back;
    edge-2 keeps INT8 and the pooled verdict is not a fleet flag."""
    central = quantizing_central
    model = build_drift_classifier(tmp_path / "drift")
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    # The real edge-1 runs without heartbeats of its own: its MQTT login is the attacker's.
    await make_edge("edge-1", central, heartbeat={"enabled": False}, inference={"choice": {"enabled": False}})
    edge2 = await make_edge(
        "edge-2", central, heartbeat={"enabled": True, "interval_s": 0.3}, broker=broker,
        inference={"choice": {"enabled": False}, "shadow_sample": 1.0},
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=central.http_url, timeout=120) as api:
        files = {"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()}
        response = await api.post("/api/v1/models/drift/versions", files=files)
        assert response.status_code == 201, response.text
        int8 = response.json()["manifest"]["artifact"]
        assert int8.startswith("int8-")
        await wait_for(lambda: edge2.edge.repository.ready(), 60, "drift served on edge-2")
        assert _served(edge2, "drift") == int8

        x, _ = drift_samples(model.prototypes, 24, shift=1.0, seed=3)  # calibration-like: INT8 agrees
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge2.http_port}", timeout=30) as client:
            for row in x:
                body = {"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, row.size],
                                    "data": row.tolist()}]}  # fmt: skip
                assert (await client.post("/v2/models/drift/infer", json=body)).status_code == 200

        lie = ModelInfo(
            name="drift", version="1", state="ready",
            choice=ArtifactChoiceInfo(artifact=int8, source="pinned"),
            shadow=ShadowInfo(samples=2000, top1_agree=0, top1_samples=2000),
        )  # fmt: skip
        await stolen.beat_for(2.0, models=[lie])
        deadline = time.monotonic() + 10
        while not await _events(api, "int8_drift"):
            assert time.monotonic() < deadline, "edge-1's own counts were not even judged"
            await stolen.beat_for(0.6, models=[lie])
        await stolen.beat_for(2.0, models=[lie])  # time for a wrong fleet-wide fallback to land

        assert _served(edge2, "drift") == int8, "edge-2 was moved off INT8 by edge-1's counts"
        report = (await api.get("/api/v1/models/drift/versions/1/agreement")).json()
        assert report["fallback_nodes"] == ["edge-1"]
        assert report["fleet"][int8]["flagged"] is False
        assert report["nodes"]["edge-2"]["verdict"]["flagged"] is False
        drifts = await _events(api, "int8_drift")
        assert [d["detail"]["nodes"] for d in drifts] == [["edge-1"]] and not drifts[0]["detail"]["fleet"]
