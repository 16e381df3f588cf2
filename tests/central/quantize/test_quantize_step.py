"""QuantizeStep in a PushContext: artifacts, report, served choice, refusals."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from central.errors import BadRequest
from central.quantize import AccuracyGuardFailed, QuantizeStep
from central.quantize.calibration import MIN_SAMPLES, load_calibration, split
from central.registry.pipeline import PushContext
from central.registry.validate import load_checked, signature
from central.settings import QuantizeSettings
from modelfleet.zoo import build_digits, build_mlp
from modelfleet.zoo.digits import DigitsModel, onnx_accuracy

REPORT_KEYS = {
    "method", "per_channel", "per_channel_fallback_reason", "fp32_bytes", "int8_bytes", "size_ratio",
    "agreement", "metric", "samples", "threshold", "seconds", "served",
}  # fmt: skip


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")


def _ctx(model: Path, tmp_path: Path, calibration: Path | None = None, **kwargs: object) -> PushContext:
    ctx = PushContext(
        name="m", version="1", labels={}, upload=model, upload_sha256="0" * 64, upload_size=model.stat().st_size,
        calibration=calibration, work_dir=tmp_path / "work", **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    ctx.inputs, ctx.outputs = signature(load_checked(model))
    return ctx


def _fragile(tmp_path: Path) -> tuple[Path, Path]:
    """A classifier INT8 cannot reproduce (class 9's logit spans -1600, so the INT8
    step of the output swamps classes 0-8), and a calibration file for it."""
    w = (np.random.default_rng(0).standard_normal((16, 10)) * 0.01).astype(np.float32)
    w[:, 9] = -100.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["logits"])],
        "fragile",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "fragile.onnx"))
    np.savez(tmp_path / "fragile.npz", input=np.random.default_rng(1).random((100, 16), dtype=np.float32))
    return tmp_path / "fragile.onnx", tmp_path / "fragile.npz"


def test_digits_serves_int8(digits: DigitsModel, tmp_path: Path) -> None:
    ctx = _ctx(digits.onnx_path, tmp_path, digits.calibration_path)
    QuantizeStep().run(ctx)
    report = ctx.quantization
    assert report is not None and report is ctx.report["quantization"]
    assert set(report) >= REPORT_KEYS
    assert (report["method"], report["metric"], report["served"]) == ("static", "top1", "int8")
    assert report["agreement"] >= 0.99 and report["threshold"] == 0.99
    assert report["samples"] == 269 and report["samples_source"] == "held-out"
    assert report["per_channel"] is False and "truth value" in report["per_channel_fallback_reason"]
    assert report["size_ratio"] == pytest.approx(report["int8_bytes"] / report["fp32_bytes"], abs=1e-4)
    assert ctx.served_artifact == "int8"
    assert ctx.artifacts == {"fp32": digits.onnx_path, "int8": tmp_path / "work" / "int8.onnx"}
    int8_accuracy = onnx_accuracy(ctx.artifacts["int8"], digits.test_x, digits.test_y)
    assert (digits.fp32_test_accuracy - int8_accuracy) * 100 <= 0.5


def test_guard_refuses_fragile_classifier(tmp_path: Path) -> None:
    model, calibration = _fragile(tmp_path)
    ctx = _ctx(model, tmp_path, calibration)
    with pytest.raises(AccuracyGuardFailed) as info:
        QuantizeStep().run(ctx)
    message = info.value.message
    assert message.startswith("INT8 agreement ") and "is below the 99.0% threshold" in message
    assert "(top-1 on 20 held-out samples); push with keep_fp32 to serve FP32" in message
    assert info.value.http_status == 422 and info.value.grpc_code == grpc.StatusCode.FAILED_PRECONDITION
    assert ctx.quantization is not None and ctx.quantization["served"] is None
    assert ctx.served_artifact == "fp32"


def test_keep_fp32_serves_fp32_and_keeps_int8(tmp_path: Path) -> None:
    model, calibration = _fragile(tmp_path)
    ctx = _ctx(model, tmp_path, calibration, keep_fp32=True)
    QuantizeStep().run(ctx)
    assert ctx.served_artifact == "fp32"
    assert set(ctx.artifacts) == {"fp32", "int8"} and ctx.artifacts["int8"].is_file()
    assert ctx.quantization is not None
    assert ctx.quantization["served"] == "fp32"
    assert ctx.quantization["served_reason"].startswith("INT8 agreement")
    assert ctx.quantization["agreement"] < 0.99


def test_dynamic_without_calibration(tmp_path: Path) -> None:
    """A random MLP's logits have tiny top-2 margins, so a few generated samples can
    flip under INT8 (63/64 here; 0.97-0.98 on 256), which would sit at the edge of the
    default 0.99; the test sets a threshold such a model meets on any CPU."""
    model = build_mlp(tmp_path / "mlp.onnx", width=64, hidden_layers=2)
    ctx = _ctx(model, tmp_path)
    QuantizeStep(QuantizeSettings(threshold=0.9)).run(ctx)
    report = ctx.quantization
    assert report is not None
    assert (report["method"], report["samples_source"], report["calibration_samples"]) == ("dynamic", "generated", 0)
    assert (report["metric"], report["samples"], report["threshold"]) == ("top1", 64, 0.9)
    assert report["agreement"] >= 0.9 and report["served"] == "int8" and report["served_reason"] is None
    assert report["per_channel"] is True and report["per_channel_fallback_reason"] is None
    assert ctx.served_artifact == "int8" and ctx.artifacts["int8"].is_file()


def test_disabled_is_a_no_op(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "mlp.onnx", width=16, hidden_layers=1)
    ctx = _ctx(model, tmp_path)
    QuantizeStep(QuantizeSettings(enabled=False)).run(ctx)
    assert ctx.artifacts == {"fp32": model} and ctx.served_artifact == "fp32" and ctx.quantization is None


def test_missing_work_dir_and_signature_are_filled_in(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "mlp.onnx", width=16, hidden_layers=1)
    ctx = _ctx(model, tmp_path, keep_fp32=True)
    ctx.work_dir, ctx.inputs, ctx.outputs = None, [], []
    QuantizeStep().run(ctx)
    try:
        assert ctx.work_dir is not None and ctx.artifacts["int8"].parent == ctx.work_dir
        assert [spec.name for spec in ctx.inputs] == ["input"]
    finally:
        import shutil

        shutil.rmtree(ctx.work_dir or tmp_path / "none", ignore_errors=True)


def test_settings_validate() -> None:
    assert QuantizeSettings().threshold == 0.99
    assert "agreement" in (QuantizeSettings.model_fields["threshold"].description or "")
    with pytest.raises(ValueError):
        QuantizeSettings(threshold=1.5)


# --- calibration files ---------------------------------------------------------------


def _bad(tmp_path: Path, digits: DigitsModel, calibration: Path) -> str:
    with pytest.raises(BadRequest) as info:
        QuantizeStep().run(_ctx(digits.onnx_path, tmp_path, calibration))
    assert info.value.http_status == 400
    return info.value.message


def test_missing_input_array(digits: DigitsModel, tmp_path: Path) -> None:
    np.savez(tmp_path / "c.npz", X=np.zeros((50, 64), np.float32))
    message = _bad(tmp_path, digits, tmp_path / "c.npz")
    assert message == "calibration file lacks arrays for inputs ['input'] (it has ['X'])"


def test_wrong_shape(digits: DigitsModel, tmp_path: Path) -> None:
    np.savez(tmp_path / "c.npz", input=np.zeros((50, 63), np.float32))
    message = _bad(tmp_path, digits, tmp_path / "c.npz")
    assert message == "calibration array 'input' has shape [50, 63], expected ['N', 64]"
    np.savez(tmp_path / "d.npz", input=np.zeros((50, 8, 8), np.float32))
    assert "has shape [50, 8, 8]" in _bad(tmp_path, digits, tmp_path / "d.npz")


def test_too_few_samples(digits: DigitsModel, tmp_path: Path) -> None:
    np.savez(tmp_path / "c.npz", input=np.zeros((MIN_SAMPLES - 1, 64), np.float32))
    assert _bad(tmp_path, digits, tmp_path / "c.npz") == "calibration file has 19 samples; at least 20 are needed"


def test_not_an_npz(digits: DigitsModel, tmp_path: Path) -> None:
    (tmp_path / "c.npz").write_bytes(b"PK\x03\x04 truncated")
    assert _bad(tmp_path, digits, tmp_path / "c.npz").startswith("calibration file is not a readable .npz archive")
    (tmp_path / "t.npz").write_text("hello")
    assert "not a readable .npz" in _bad(tmp_path, digits, tmp_path / "t.npz")
    np.save(tmp_path / "a.npy", np.zeros((50, 64), np.float32))
    assert "single .npy array" in _bad(tmp_path, digits, tmp_path / "a.npy")


def test_uncastable_dtype_and_pickles(digits: DigitsModel, tmp_path: Path) -> None:
    np.savez(tmp_path / "c.npz", input=np.full((50, 64), "x"))
    assert "dtype <U1, not castable to float32" in _bad(tmp_path, digits, tmp_path / "c.npz")
    np.savez(tmp_path / "p.npz", input=np.array([object()] * 50, dtype=object))
    assert "not a readable .npz" in _bad(tmp_path, digits, tmp_path / "p.npz")


def test_split_and_ignored_arrays(digits: DigitsModel, tmp_path: Path) -> None:
    x = np.arange(100 * 64, dtype=np.float64).reshape(100, 64)
    np.savez(tmp_path / "c.npz", input=x, labels=np.arange(100))
    data = load_calibration(tmp_path / "c.npz", _ctx(digits.onnx_path, tmp_path).inputs)
    assert data.samples == 100 and data.ignored == ["labels"] and data.arrays["input"].dtype == np.float32
    calibration, held_out = split(data)
    assert calibration["input"].shape == (80, 64) and held_out["input"].shape == (20, 64)
    rows = {row[0] for row in calibration["input"]} | {row[0] for row in held_out["input"]}
    assert len(rows) == 100  # disjoint and complete
    assert held_out["input"][:, 0].tolist() != x[80:, 0].tolist()  # a permutation, not the file's tail


def test_fixed_batch_model(tmp_path: Path) -> None:
    """A model whose batch dimension is fixed at 2 gets whole batches of 2 everywhere."""
    w = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "fixed.onnx"))
    np.savez(tmp_path / "c.npz", input=np.random.default_rng(1).standard_normal((45, 16)).astype(np.float32))
    ctx = _ctx(tmp_path / "fixed.onnx", tmp_path, tmp_path / "c.npz")
    QuantizeStep().run(ctx)
    assert ctx.quantization is not None and ctx.quantization["samples"] == 10
    generated = _ctx(tmp_path / "fixed.onnx", tmp_path)
    QuantizeStep(QuantizeSettings(generated_samples=5)).run(generated)
    assert generated.quantization is not None and generated.quantization["samples"] == 6
