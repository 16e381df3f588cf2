"""Pushes of models as current exporters write them, through central's real REST API: an IR
version or opset newer than the installed ONNX Runtime loads is converted down when that
is safe (the push report says so, and what central stores loads and answers as the
original would), and refused with a 400 that names both versions when it is not. An edge
serves such a model: the IR-version bug that let a checker-valid model fail to load on
every edge."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from central.server import CentralServer
from fleetwire.runtime_limits import RuntimeLimits, runtime_limits
from support.fleet import EdgeFactory, push
from support.onnx_versions import dense_model, save, swiglu_model, with_initializer_type
from support.wait import wait_for

FLOAT6E2M3 = 27  # added with IR 14
X = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def limits() -> RuntimeLimits:
    return runtime_limits()


def _newest_opset(limits: RuntimeLimits) -> int:
    opset = limits.max_opset("")
    assert opset is not None
    return opset


def _stored_graph(server: CentralServer, manifest: dict[str, object]) -> bytes:
    blobs = server.settings.data_dir / "blobs" / "sha256"
    chunks = manifest["chunks"]
    assert isinstance(chunks, list)
    return b"".join((blobs / c["digest"][:2] / c["digest"]).read_bytes() for c in chunks)


def _run(model: bytes | str, x: np.ndarray = X) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input": x})[0])


def _reference(opset: int, limits: RuntimeLimits) -> np.ndarray:
    """The same weights at an opset and IR version the runtime loads."""
    return _run(dense_model(min(opset, _newest_opset(limits)), limits.max_ir_version).SerializeToString())


@pytest.mark.parametrize("opset", [18, 21, onnx.defs.onnx_opset_version()])
async def test_an_exporter_stamped_model_is_stored_as_the_runtime_loads_it(
    central: CentralServer, api: httpx.AsyncClient, tmp_path: Path, limits: RuntimeLimits, opset: int
) -> None:
    model = dense_model(opset)  # the IR version onnx.helper stamps: the installed onnx's newest
    stamped = model.ir_version
    pushed = await push(api, "m", save(model, tmp_path / "model.onnx"))
    assert pushed.status_code == 201, pushed.text
    manifest, report = pushed.json()["manifest"], pushed.json()["report"]
    newest = _newest_opset(limits)
    expected: dict[str, dict[str, int]] = {}
    if stamped > limits.max_ir_version:
        expected["ir_version"] = {"from": stamped, "to": limits.max_ir_version}
    if opset > newest:
        expected["opset"] = {"from": opset, "to": newest}
    assert expected, "the installed onnx and ONNX Runtime agree: nothing to convert, the test would prove nothing"
    compat = report["compatibility"]
    assert {k: compat[k] for k in ("ir_version", "opset") if k in compat} == expected
    assert compat["runtime"] == limits.runtime and len(compat["notes"]) == len(expected)
    if "opset" in expected:
        assert f"opset {opset} converted to {newest}" in " ".join(compat["notes"])

    stored = _stored_graph(central, manifest)
    assert manifest["sha256"] == hashlib.sha256(stored).hexdigest()
    proto = onnx.load_from_string(stored)
    assert proto.ir_version == min(stamped, limits.max_ir_version)
    assert [o.version for o in proto.opset_import if o.domain == ""] == [min(opset, newest)]
    np.testing.assert_allclose(_run(stored), _reference(opset, limits), rtol=1e-5, atol=1e-6)


async def test_a_model_the_runtime_loads_is_stored_unchanged(
    central: CentralServer, api: httpx.AsyncClient, tmp_path: Path, limits: RuntimeLimits
) -> None:
    path = save(dense_model(21, min(10, limits.max_ir_version)), tmp_path / "model.onnx")
    pushed = await push(api, "m", path)
    assert pushed.status_code == 201, pushed.text
    assert "compatibility" not in pushed.json()["report"]
    assert _stored_graph(central, pushed.json()["manifest"]) == path.read_bytes()


async def test_an_opset_the_converter_cannot_bring_down_is_a_400_naming_both(
    central: CentralServer, api: httpx.AsyncClient, tmp_path: Path, limits: RuntimeLimits
) -> None:
    newest = _newest_opset(limits)
    if newest >= 28:
        pytest.skip(f"{limits.runtime} loads opset 28: SwiGLU (new in 28) needs no conversion")
    refused = await push(api, "m", save(swiglu_model(28), tmp_path / "model.onnx"))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert f"opset 28 (ai.onnx), newer than opset {newest}, the newest that {limits.runtime} loads" in error
    assert "(No Previous Version of SwiGLU exists)" in error and f"opset_version={newest}" in error
    assert (await api.get("/api/v1/models")).json() == []
    assert list((central.settings.data_dir / "staging").iterdir()) == []


async def test_an_ir_version_the_content_needs_is_a_400_naming_what_needs_it(
    central: CentralServer, api: httpx.AsyncClient, tmp_path: Path, limits: RuntimeLimits
) -> None:
    if limits.max_ir_version >= 14:
        pytest.skip(f"{limits.runtime} loads IR 14: no data type the test knows is too new for it")
    model = with_initializer_type(dense_model(17, 14), FLOAT6E2M3)
    refused = await push(api, "m", save(model, tmp_path / "model.onnx"))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert f"IR version 14 is newer than IR {limits.max_ir_version}, the newest that {limits.runtime} loads" in error
    assert "it needs IR 14 (initializer 'extra': FLOAT6E2M3)" in error
    assert (await api.get("/api/v1/models")).json() == []


async def test_a_newer_ml_opset_is_a_400(api: httpx.AsyncClient, tmp_path: Path, limits: RuntimeLimits) -> None:
    newest_ml = limits.max_opset("ai.onnx.ml")
    assert newest_ml is not None
    model = dense_model(21, 10)
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", newest_ml + 1))
    refused = await push(api, "m", save(model, tmp_path / "model.onnx"))
    assert refused.status_code == 400, refused.text
    assert f"opset {newest_ml + 1} of ai.onnx.ml, newer than {newest_ml}" in refused.json()["error"]


async def test_an_edge_serves_an_external_data_model_exported_for_a_newer_runtime(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path, limits: RuntimeLimits
) -> None:
    opset = onnx.defs.onnx_opset_version()
    graph = tmp_path / "export" / "model.onnx"
    graph.parent.mkdir()
    onnx.save_model(dense_model(opset), str(graph), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=0)  # fmt: skip
    data = graph.parent / "model.onnx.data"
    edge = await make_edge("edge-0", central)
    files = [("file", ("model.onnx", graph.read_bytes())), ("data", ("model.onnx.data", data.read_bytes()))]
    pushed = await api.post("/api/v1/models/m/versions", files=files)
    assert pushed.status_code == 201, pushed.text
    assert pushed.json()["report"]["compatibility"]["notes"]
    assert pushed.json()["manifest"]["files"][0]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()

    await wait_for(lambda: edge.edge.repository.ready(), 60, "m served on the edge")
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(X.shape), "data": X.ravel().tolist()}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
        answer = await oip.post("/v2/models/m/infer", json=body)
    assert answer.status_code == 200, answer.text
    got = np.asarray(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(X.shape[0], -1)
    np.testing.assert_allclose(got, _reference(opset, limits), rtol=1e-5, atol=1e-6)
