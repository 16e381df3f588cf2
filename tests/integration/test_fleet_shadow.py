"""INT8 watched on live traffic, edge side: a real quantizing central and a real edge. The
edge serving the INT8 artifact runs sampled requests again on FP32 and reports how far they
agree in its status and heartbeat; central's ``force_artifact`` makes it serve FP32 at once
(FP32 is on disk already, beside the INT8 it checks), and the node goes back to INT8 when
the order ends."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from edge_node.sync.state import EdgeDesiredState
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

WIDTH = 32


@pytest.fixture
async def quantizing_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    # A random MLP's near-ties flip under INT8; the test is about the edge, not the guard.
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True, "threshold": 0.5}))
    await server.start()
    yield server
    await server.stop()


async def _status(edge: EdgeServer) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        response = await client.get("/api/v1/status")
    assert response.status_code == 200
    return dict(response.json())


async def _infer(edge: EdgeServer, rows: int) -> None:
    data = np.random.default_rng(rows).standard_normal(rows * WIDTH).tolist()
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, WIDTH], "data": data}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        response = await client.post("/v2/models/m/infer", json=body)
    assert response.status_code == 200, response.text


def _forced(state: EdgeDesiredState, artifact: str | None) -> EdgeDesiredState:
    """``state`` as central sends it with (or without) a fallback order for every version."""
    versions = [dataclasses.replace(v, force_artifact=artifact) for v in state.versions]
    return dataclasses.replace(state, versions=versions)


def _served(edge: EdgeServer) -> str:
    return edge.edge.repository.get("m").artifact


async def test_int8_is_sampled_against_fp32_and_central_can_force_fp32(
    quantizing_central: CentralServer, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    model = build_mlp(tmp_path / "m.onnx", width=WIDTH, hidden_layers=1)
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=120) as api:
        response = await push(api, "m", model)
        assert response.status_code == 201, response.text
        int8 = response.json()["manifest"]["artifact"]
    assert int8.startswith("int8-")
    # Every request sampled, so a handful show; timing off: the edge serves central's INT8.
    inference = {"choice": {"enabled": False}, "shadow_sample": 1.0}
    edge = await make_edge("edge-1", quantizing_central, inference=inference)
    await wait_for(edge.edge.repository.ready, 60, "m served")
    assert _served(edge) == int8
    assert edge.edge.files.is_complete(edge.edge.follower.state.versions[0].manifest, "fp32")  # fetched for the shadow

    for rows in (1, 2, 3):
        await _infer(edge, rows)
    sampler = edge.edge.repository.get("m").shadow
    assert sampler is not None
    sampler.join()
    shadow = (await _status(edge))["shadow"]["m:1"]
    assert shadow["artifact"] == int8 and shadow["reference"] == "fp32"
    assert shadow["samples"] == 6 and shadow["top1_samples"] == 6 and shadow["measure"] == "cosine"
    assert 0.5 * 6 < shadow["measure_sum"] <= 6.0 + 1e-9 and shadow["dropped"] == 0
    beat = next(m for m in edge.edge._heartbeat_sources().snapshot().models if m.name == "m")
    assert beat.shadow is not None and beat.shadow.samples == 6 and beat.shadow.top1_samples == 6

    state = edge.edge.follower.state
    assert state is not None
    edge.edge.materializer.apply(_forced(state, "fp32"))
    await wait_for(lambda: _served(edge) == "fp32", 5, "fp32 served on central's order")
    await _infer(edge, 2)
    status = await _status(edge)
    assert status["artifacts"]["m:1"]["artifact"] == "fp32" and status["artifacts"]["m:1"]["source"] == "central"
    assert status["shadow"] == {}  # FP32 is not checked against itself
    beat = next(m for m in edge.edge._heartbeat_sources().snapshot().models if m.name == "m")
    assert beat.shadow is None and beat.choice is not None and beat.choice.artifact == "fp32"

    edge.edge.materializer.apply(_forced(state, None))
    await wait_for(lambda: _served(edge) == int8, 5, "INT8 served again once the order ended")
    await _infer(edge, 1)
    assert (await _status(edge))["artifacts"]["m:1"]["artifact"] == int8


async def test_a_cache_too_small_for_the_fp32_reference_serves_int8_unchecked(
    quantizing_central: CentralServer, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    model = build_mlp(tmp_path / "m.onnx", width=512, hidden_layers=3)  # the cache's floor is 1 MiB
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=120) as api:
        response = await push(api, "m", model)
        assert response.status_code == 201, response.text
        manifest = response.json()["manifest"]
    int8 = manifest["artifact"]
    fp32 = next(a for a in manifest["alternatives"] if a["artifact"] == "fp32")
    int8_bytes = sum(c["size"] for c in manifest["chunks"])
    # Room for the INT8 artifact served, not for its FP32 reference beside it.
    cap = int8_bytes + sum(c["size"] for c in fp32["chunks"]) // 2
    assert cap >= 1 << 20
    inference = {"choice": {"enabled": False}, "shadow_sample": 1.0}
    edge = await make_edge("edge-1", quantizing_central, inference=inference, cache_bytes=cap)
    await wait_for(edge.edge.repository.ready, 60, "m served")
    assert _served(edge) == int8 and edge.edge.materializer.refusals == {}
    assert edge.edge.repository.get("m").shadow is None
    assert ("m", "1") in edge.edge.materializer.chooser.unchecked
