"""What torch writes, quantized by central (issue 25): the fixtures in
``tests/fixtures/exported/`` were written by torch 2.13's default exporter (``make
fixtures-export``), each as ``model.onnx`` plus ``model.onnx.data``; no torch here.

The BERT classifier fails ORT's dynamic quantizer as exported (stale ``value_info``) and
gets INT8 once central has cleaned the graph, with the report saying what was cleaned
and why; the opset-23 BERT's standard ``Attention`` stays FP32 instead of becoming a
``QAttention`` no runtime loads; the CNN quantizes as pushed."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from central.quantize import GuardStep, QuantizeStep
from central.quantize.recipes import DYNAMIC
from central.registry.pipeline import PushContext
from central.registry.validate import load_checked, signature
from central.server import CentralServer
from central.settings import QuantizeSettings
from support.external_data import DATA_FILE, model_files
from support.fleet import central_settings

EXPORTED = Path(__file__).resolve().parents[2] / "fixtures" / "exported"
STALE = "Inferred shape and existing shape differ"
PROVIDERS = ["CPUExecutionProvider"]


def _copy(name: str, tmp_path: Path) -> Path:
    """The fixture's directory copied (the push steps write next to nothing, but stay safe)."""
    shutil.copytree(EXPORTED / name, tmp_path / name)
    return tmp_path / name / "model.onnx"


def _push(model: Path, tmp_path: Path) -> PushContext:
    """Central's quantize and guard steps on ``model``, as a push without data runs them."""
    ctx = PushContext(
        name="m", version="1", labels={}, upload=model, upload_sha256="0" * 64, upload_size=model.stat().st_size,
        work_dir=tmp_path / "work",
    )  # fmt: skip
    ctx.inputs, ctx.outputs = signature(load_checked(model))
    QuantizeStep(QuantizeSettings(cpu_flags=["avx2", "fma"])).run(ctx)
    GuardStep().run(ctx)
    return ctx


def _tokens(batch: int, seq: int, vocab: int = 500) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
    }


def _logits(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(ort.InferenceSession(str(path), providers=PROVIDERS).run(["logits"], feeds)[0])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_fixtures_are_what_torch_writes() -> None:
    for name in ("bert", "bert-opset23", "cnn"):
        model = onnx.load(str(EXPORTED / name / "model.onnx"), load_external_data=False)
        assert model.producer_name == "pytorch" and model.producer_version.startswith("2.13")
        assert sorted(model_files(EXPORTED / name / "model.onnx")) == ["model.onnx", DATA_FILE]
        weights = {t.name for t in model.graph.initializer}
        assert weights & {v.name for v in model.graph.value_info}, "the exporter records initializers' shapes"


def test_exported_bert_gets_int8_after_its_graph_is_cleaned(tmp_path: Path) -> None:
    model = _copy("bert", tmp_path)
    ctx = _push(model, tmp_path)
    report = ctx.quantization
    assert report is not None and report["family"] == "transformer"
    assert ctx.served_artifact == DYNAMIC and report["served"] == DYNAMIC and report["failed_recipes"] == {}
    normalized = report["normalized"]
    assert STALE in normalized["as_pushed_failures"][DYNAMIC]
    assert any("value_info" in change and "initializers'" in change for change in normalized["changes"])
    assert normalized["shape_inference"] == "strict" and normalized["kept_fp32"] == []
    assert ctx.artifact_reports[DYNAMIC]["normalized"] == normalized["changes"]
    # LayerNorm and GELU fused; the exporter's own LayerNormalization nodes are not counted as fused.
    assert report["fused_operators"] == {"SkipLayerNormalization": 4, "BiasGelu": 2}
    int8 = ctx.artifacts[DYNAMIC]
    ops = {n.op_type for n in onnx.load(str(int8)).graph.node}
    assert ops & {"DynamicQuantizeMatMul", "MatMulInteger"}, ops
    feeds = _tokens(4, 24)
    assert _cosine(_logits(int8, feeds), _logits(model, feeds)) > 0.99
    assert report["int8_bytes"] < 0.5 * report["fp32_bytes"]


def test_the_opset_23_attention_stays_fp32_and_the_rest_is_int8(tmp_path: Path) -> None:
    model = _copy("bert-opset23", tmp_path)
    attention = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node if n.op_type == "Attention"]
    ctx = _push(model, tmp_path)
    report = ctx.quantization
    assert report is not None and report["served"] == DYNAMIC
    assert report["normalized"]["kept_fp32"] == attention and len(attention) == 1
    assert any("Attention" in change and "opset 23" in change for change in report["normalized"]["changes"])
    assert report["nodes_excluded"] == []  # kept by the cleaning, not the guard's exclusions
    assert "Attention" not in (report["fused_operators"] or {})  # the exporter's, not the optimizer's
    nodes = onnx.load(str(ctx.artifacts[DYNAMIC])).graph.node
    assert "QAttention" not in {n.op_type for n in nodes}
    assert [n.name for n in nodes if n.op_type == "Attention" and n.domain in ("", "ai.onnx")] == attention
    feeds = _tokens(2, 12, vocab=500)
    assert _cosine(_logits(ctx.artifacts[DYNAMIC], feeds), _logits(model, feeds)) > 0.99


def test_exported_cnn_quantizes_as_pushed(tmp_path: Path) -> None:
    model = _copy("cnn", tmp_path)
    ctx = _push(model, tmp_path)
    report = ctx.quantization
    assert report is not None and report["family"] == "cnn" and report["normalized"] is None
    assert report["served"] is not None and report["served"].startswith("int8-") and report["failed_recipes"] == {}
    images = np.random.default_rng(4).standard_normal((4, 3, 32, 32)).astype(np.float32)
    feeds = {"image": images}
    assert _cosine(_logits(ctx.artifacts[report["served"]], feeds), _logits(model, feeds)) > 0.99


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client on a started central that quantizes (default settings)."""
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as client:
            yield client
    finally:
        await server.stop()


async def test_a_push_of_the_exported_bert_with_its_data_file_is_served_int8(api: httpx.AsyncClient) -> None:
    files = model_files(EXPORTED / "bert" / "model.onnx")
    parts: list[tuple[str, tuple[str, bytes]]] = [("file", ("model.onnx", files["model.onnx"]))]
    parts.append(("data", (DATA_FILE, files[DATA_FILE])))
    response = await api.post("/api/v1/models/bert/versions", files=parts)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    report = body["report"]["quantization"]
    assert body["manifest"]["artifact"] == DYNAMIC == report["served"]
    assert STALE in report["normalized"]["as_pushed_failures"][DYNAMIC]
    assert body["manifest"]["quantization"]["normalized"] == report["normalized"]
