"""INT8 on live traffic end to end (a quantizing central, Mosquitto, a real edge): a version whose
INT8 passed the guard on its calibration data meets live inputs from a shifted distribution;
the edge's shadow samples show the disagreement in its heartbeats, central flags it
(``int8_drift``), the edge serves FP32 within seconds (``int8_fallback``), the agreement API
tells the story, and clearing the fallback puts INT8 back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.zoo import DRIFT_SHIFT, build_drift_classifier, drift_samples
from support.brokers import MosquittoBroker
from support.cli import run_cli
from support.fleet import EdgeFactory, central_settings, events_of
from support.wait import wait_for


@pytest.fixture
async def drift_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


def _served(edge: EdgeServer) -> str:
    return edge.edge.repository.get("drift").artifact


async def test_live_drift_is_flagged_and_the_edge_falls_back_to_fp32(
    drift_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    model = build_drift_classifier(tmp_path / "drift")
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edge = await make_edge(
        "edge-0", drift_central, heartbeat={"enabled": True, "interval_s": 0.3}, broker=broker,
        inference={"choice": {"enabled": False}, "shadow_sample": 1.0},  # every request sampled: quick
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=drift_central.http_url, timeout=120) as api:
        files = {"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()}
        response = await api.post("/api/v1/models/drift/versions", files=files)
        assert response.status_code == 201, response.text
        int8 = response.json()["manifest"]["artifact"]
        assert int8.startswith("int8-")
        await wait_for(lambda: edge.edge.repository.ready(), 60, "drift served")
        assert _served(edge) == int8

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:

            async def send(shift: float, count: int, seed: int) -> None:
                x, _ = drift_samples(model.prototypes, count, shift=shift, seed=seed)
                for row in x:
                    body = {"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, row.size],
                                        "data": row.tolist()}]}  # fmt: skip
                    reply = await client.post("/v2/models/drift/infer", json=body)
                    assert reply.status_code == 200, reply.text

            await send(1.0, 40, seed=1)  # calibration-like traffic: INT8 agrees, nothing happens
            await asyncio.sleep(1.5)
            assert await events_of(api, "int8_drift") == [] and _served(edge) == int8
            calm = (await api.get("/api/v1/models/drift/versions/1/agreement")).json()
            assert calm["nodes"]["edge-0"]["verdict"]["flagged"] is False

            sent = 0
            deadline = time.monotonic() + 60
            while not await events_of(api, "int8_drift"):
                assert time.monotonic() < deadline, "no int8_drift after the traffic shifted"
                await send(DRIFT_SHIFT, 10, seed=sent)
                sent += 10
            flagged_at = time.monotonic()
        (drift,) = await events_of(api, "int8_drift")
        assert drift["detail"]["nodes"] == ["edge-0"] and drift["detail"]["policy"] == "fallback"
        assert drift["detail"]["value"] < drift["detail"]["threshold"]
        await wait_for(lambda: _served(edge) == "fp32", 10, "the edge on FP32")
        assert time.monotonic() - flagged_at < 5
        (fallback,) = await events_of(api, "int8_fallback")
        assert fallback["detail"]["nodes"] == ["edge-0"]
        report = (await api.get("/api/v1/models/drift/versions/1/agreement")).json()
        assert report["fallback_nodes"] == ["edge-0"] and report["nodes"]["edge-0"]["serves"] == "fp32"
        # One node's counts flag that node, never the fleet (a fleet flag needs two reporters).
        assert report["nodes"]["edge-0"]["verdict"]["flagged"] and not report["fleet"][int8]["flagged"]
        shown = await run_cli(tmp_path, drift_central, "models", "agreement", "drift", "1")
        assert "FLAGGED" in shown and "serving FP32 by central's fallback: edge-0" in shown and "pooled" in shown

        cleared = await api.delete("/api/v1/models/drift/versions/1/agreement")
        assert cleared.status_code == 200 and cleared.json()["cleared_nodes"] == ["edge-0"]
        await wait_for(lambda: _served(edge) == int8, 10, "INT8 served again once cleared")
