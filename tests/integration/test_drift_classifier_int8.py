"""The drift classifier: pushed with its calibration data, central's INT8 passes the guard and
agrees with FP32 on calibration-like inputs, and disagrees on most drifted (×10) inputs, on
the real artifacts of the stored version in ONNX Runtime sessions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from central.server import CentralServer
from modelfleet.zoo import DRIFT_SHIFT, build_drift_classifier, drift_samples
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for


@pytest.fixture
async def quantizing_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


def _decisions(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": x})[0]
    return np.asarray(logits).argmax(axis=1)


async def test_int8_passes_the_guard_then_disagrees_with_fp32_on_drifted_inputs(
    quantizing_central: CentralServer, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    model = build_drift_classifier(tmp_path / "drift")
    # Choice off: the edge assembles central's default artifact, the INT8 under test.
    edge = await make_edge("edge-0", quantizing_central, inference={"choice": {"enabled": False}})
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=120) as api:
        files = {"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()}
        response = await api.post("/api/v1/models/drift/versions", files=files)
        assert response.status_code == 201, response.text
        manifest = response.json()["manifest"]
    report = manifest["quantization"]
    assert manifest["artifact"].startswith("int8-") and report["lower_bound"] >= report["threshold"]
    assert report["lower_bound"] >= 0.98, report  # a margin, not a one-sample pass
    await wait_for(lambda: edge.edge.repository.ready(), 60, "drift ready")
    int8 = edge.edge.files.model_path("drift", "1")
    assert int8.parent.name == manifest["artifact"]

    calm, labels = drift_samples(model.prototypes, 1000, seed=5)
    fp32_calm, int8_calm = _decisions(model.onnx_path, calm), _decisions(int8, calm)
    assert (fp32_calm == labels).mean() >= 0.99
    assert (fp32_calm == int8_calm).mean() >= 0.99

    drifted, labels = drift_samples(model.prototypes, 1000, shift=DRIFT_SHIFT, seed=5)
    fp32_drift, int8_drift = _decisions(model.onnx_path, drifted), _decisions(int8, drifted)
    assert (fp32_drift == labels).mean() >= 0.99  # FP32 does not clip: still right
    assert (fp32_drift == int8_drift).mean() <= 0.6  # INT8 clips at the calibrated range
