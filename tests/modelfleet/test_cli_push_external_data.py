"""``modelfleet push model.onnx`` of a model whose weights are in ONNX external data: the CLI
finds the data file next to the graph and uploads every file; central quantizes it (to
external data too), chunks every file and signs it; edges of a real fleet fetch, assemble
and serve it, with outputs that match ONNX Runtime on the original. And the mistakes the
CLI can see itself are usage errors before any byte is sent."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from cli_harness import Cli, one_error_line

from central.server import CentralServer
from support.external_data import DATA_FILE, build_external_mlp, set_location
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for

WIDTH = 256


@pytest.fixture
async def quantizing_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    # One regression output: the guard judges by relative error (random weights decide no class).
    server = CentralServer(
        central_settings(tmp_path / "central", quantize={"enabled": True, "threshold": 0.9, "external_data_bytes": 0})
    )
    await server.start()
    yield server
    await server.stop()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_the_cli_pushes_every_file_and_the_fleet_serves_the_quantized_model(
    tmp_path: Path, quantizing_central: CentralServer, make_edge: EdgeFactory
) -> None:
    graph = build_external_mlp(tmp_path / "export", width=WIDTH, hidden_layers=2, classes=1)
    # Choice off: these edges serve central's default artifact, the INT8 path under test
    # (timing would rightly pick FP32 for a model this small).
    no_timing = {"choice": {"enabled": False}}
    edges = [await make_edge(f"edge-{i}", quantizing_central, inference=no_timing) for i in range(2)]
    pushed = await Cli(tmp_path, quantizing_central.http_url)("push", str(graph), "--name", "ext", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    manifest = json.loads(pushed.stdout)["manifest"]

    # Served INT8 (written with external data: the setting's bound is 0 here, where a real
    # fleet sets it at the 2 GiB protobuf limit); FP32 (the upload, both files) offered beside it.
    assert manifest["artifact"].startswith("int8-") and len(manifest["files"]) == 1
    (fp32,) = [a for a in manifest["alternatives"] if a["artifact"] == "fp32"]
    assert fp32["sha256"] == _sha(graph)
    assert [(f["path"], f["sha256"]) for f in fp32["files"]] == [(DATA_FILE, _sha(graph.parent / DATA_FILE))]
    assert manifest["signature"]

    await wait_for(lambda: all(e.edge.repository.ready() for e in edges), 60, "ext served on every edge")
    x = np.random.default_rng(1).standard_normal((8, WIDTH)).astype(np.float32)
    expected = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    for edge in edges:
        directory = edge.edge.settings.data_dir / "versions" / "ext" / "1" / manifest["artifact"]
        data = manifest["files"][0]
        assert _sha(directory / "model.onnx") == manifest["sha256"]
        assert _sha(directory / data["path"]) == data["sha256"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
            answer = await oip.post("/v2/models/ext/infer", json=body)
        assert answer.status_code == 200, answer.text
        got = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(expected.shape)
        # INT8 against FP32: as close as the guard measured (relative L2 error under 10%).
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.1


async def test_the_cli_refuses_a_model_whose_data_it_cannot_send(tmp_path: Path) -> None:
    cli = Cli(tmp_path, "http://127.0.0.1:9")  # never reached
    graph = build_external_mlp(tmp_path / "missing", width=16)
    (graph.parent / DATA_FILE).unlink()
    missing = await cli("push", str(graph), "--name", "m")
    assert missing.exit_code == 2 and "model.onnx.data" in one_error_line(missing) and "not in" in missing.stderr

    outside = build_external_mlp(tmp_path / "outside", width=16)
    set_location(outside, "../model.onnx.data")
    refused = await cli("push", str(outside), "--name", "m")
    assert refused.exit_code == 2 and "not in a file next to it" in one_error_line(refused)
