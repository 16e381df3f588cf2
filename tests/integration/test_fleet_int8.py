"""The whole path with quantization on: a push is quantized at central, distributed,
loaded on every edge and served as INT8 over OIP v2 with FP32-level accuracy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from modelfleet.zoo import build_digits, build_mlp
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for


@pytest.fixture
async def quantizing_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def test_digits_is_quantized_distributed_and_served_as_int8(
    quantizing_central: CentralServer, make_edge: EdgeFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    digits = build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")  # trained once per session, not per test
    # Choice off: these edges serve central's default artifact, the INT8 path under test
    # (timing would rightly pick FP32 for a model this small).
    no_timing = {"choice": {"enabled": False}}
    edges = [await make_edge(f"edge-{i}", quantizing_central, inference=no_timing) for i in range(2)]
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=120) as api:
        files = {"file": digits.onnx_path.read_bytes(), "calibration": digits.calibration_path.read_bytes()}
        response = await api.post("/api/v1/models/digits/versions", files=files)
        assert response.status_code == 201, response.text
        manifest = response.json()["manifest"]
        report = manifest["quantization"]
        assert manifest["artifact"].startswith("int8-") and report["method"] == "static"
        assert report["served"] == manifest["artifact"]
        assert report["lower_bound"] >= report["threshold"] and report["int8_bytes"] < report["fp32_bytes"]
        fp32 = (await api.get("/api/v1/models/digits/versions/1", params={"artifact": "fp32"})).json()
        assert fp32["sha256"] != manifest["sha256"] and fp32["artifact"] == "fp32"

    await wait_for(lambda: all(e.edge.repository.ready() for e in edges), 60, "digits ready everywhere")
    for edge in edges:
        assert edge.edge.files.model_path("digits", "1").stat().st_size == manifest["size"]
        x = digits.test_x
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=60) as oip:
            doc = (await oip.post("/v2/models/digits/infer", json=body)).json()
        labels = np.array(next(o for o in doc["outputs"] if o["name"] == "label")["data"])
        int8_accuracy = float((labels == digits.test_y).mean())
        assert digits.fp32_test_accuracy - int8_accuracy <= 0.005


async def test_int8_that_disagrees_is_refused_only_when_required_else_fp32_is_served(
    tmp_path: Path,
) -> None:
    settings = central_settings(tmp_path / "central", quantize={"enabled": True, "threshold": 0.99999})
    server = CentralServer(settings)
    await server.start()
    try:
        model = build_mlp(tmp_path / "m.onnx", width=384, hidden_layers=4)  # random logits: INT8 flips some
        async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as api:
            url, body = "/api/v1/models/m/versions", model.read_bytes()
            refused = await api.post(url, params={"require_int8": "true"}, content=body)
            assert refused.status_code == 422
            assert "below the 99.999% threshold" in refused.json()["error"] and "keep_fp32" in refused.json()["error"]
            assert (await api.get("/api/v1/models")).json() == []
            kept = await api.post("/api/v1/models/m/versions", params={"keep_fp32": "true"}, content=model.read_bytes())
            assert kept.status_code == 201, kept.text
            assert kept.json()["manifest"]["artifact"] == "fp32"
            assert kept.json()["manifest"]["quantization"]["served"] == "fp32"
            plain = await api.post(url, content=body)  # no push is lost: FP32 served, and why
            assert plain.status_code == 201, plain.text
            assert plain.json()["manifest"]["artifact"] == "fp32"
            assert plain.json()["report"]["quantization"]["int8"]["status"] == "refused"
    finally:
        await server.stop()
