"""Serving through a rollout: a new version replaces the old one on an edge while
clients keep sending requests, and not one of them fails."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from central.server import CentralServer
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, push
from support.wait import wait_for


async def _client(base: str, stop: asyncio.Event, outcomes: Counter[str], versions: Counter[str]) -> None:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 64], "data": np.ones(128).tolist()}]}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        while not stop.is_set():
            response = await client.post("/v2/models/mlp/infer", json=body)
            outcomes[str(response.status_code)] += 1
            if response.status_code == 200:
                versions[response.json()["model_version"]] += 1


async def test_a_version_swap_under_load_fails_no_request(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await make_edge("edge-0", central)
    v1 = build_mlp(tmp_path / "v1.onnx", width=64, hidden_layers=2)
    v2 = build_mlp(tmp_path / "v2.onnx", width=64, hidden_layers=2, head_seed=5)
    assert (await push(api, "mlp", v1)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="v1 ready")

    stop, outcomes, versions = asyncio.Event(), Counter[str](), Counter[str]()
    base = f"http://127.0.0.1:{edge.http_port}"
    clients = [asyncio.create_task(_client(base, stop, outcomes, versions)) for _ in range(8)]
    try:
        await wait_for(lambda: versions["1"] > 20, what="traffic on v1")
        assert (await push(api, "mlp", v2)).status_code == 201
        await wait_for(lambda: versions["2"] > 20, 60, "traffic moving to v2")
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert set(outcomes) == {"200"}, outcomes
    assert edge.edge.repository.get("mlp").version == "2"
