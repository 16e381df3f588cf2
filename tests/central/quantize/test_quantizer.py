"""central.quantize.quantizer on real graphs: static on digits, dynamic on build_mlp,
and the per-channel fallback that ORT 1.31 genuinely needs on skl2onnx MLPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from central.quantize import load_calibration, quantize, split
from central.quantize.quantizer import QuantizationError, preprocess, shorten, verify
from central.registry.validate import signature
from modelfleet.zoo import build_digits, build_mlp
from modelfleet.zoo.digits import DigitsModel, onnx_accuracy


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    """Same cache path as the zoo tests, so the classifier is trained once per session."""
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")


def _calibration(model: DigitsModel) -> dict[str, np.ndarray]:
    inputs, _ = signature(onnx.load(str(model.onnx_path)))
    calibration, _ = split(load_calibration(model.calibration_path, inputs))
    return calibration


def test_digits_static_keeps_accuracy(digits: DigitsModel, tmp_path: Path) -> None:
    out = tmp_path / "int8.onnx"
    result = quantize(digits.onnx_path, out, calibration=_calibration(digits), work_dir=tmp_path / "w")
    assert result.method == "static"
    assert result.int8_bytes == out.stat().st_size < result.fp32_bytes == digits.onnx_path.stat().st_size
    int8_accuracy = onnx_accuracy(out, digits.test_x, digits.test_y)
    assert (digits.fp32_test_accuracy - int8_accuracy) * 100 <= 0.5
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert not (tmp_path / "w" / "preprocessed.onnx").exists()


def test_digits_per_channel_falls_back_for_real(digits: DigitsModel, tmp_path: Path) -> None:
    """ORT 1.31's QDQ quantizer raises in _adjust_weight_scale_for_int32_bias when a
    Gemm has a bias and per-channel weight scales (skl2onnx's MLP); nothing is faked."""
    result = quantize(digits.onnx_path, tmp_path / "q.onnx", calibration=_calibration(digits), work_dir=tmp_path)
    assert result.per_channel is False
    assert result.per_channel_fallback_reason is not None
    assert result.per_channel_fallback_reason.startswith("ValueError: The truth value of an array")


def test_build_mlp_static_per_channel_works(tmp_path: Path) -> None:
    fp32 = build_mlp(tmp_path / "m.onnx", width=64, hidden_layers=2)
    calibration = {"input": np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)}
    result = quantize(fp32, tmp_path / "q.onnx", calibration=calibration, work_dir=tmp_path)
    assert (result.method, result.per_channel, result.per_channel_fallback_reason) == ("static", True, None)


def test_build_mlp_dynamic_without_calibration(tmp_path: Path) -> None:
    fp32 = build_mlp(tmp_path / "m.onnx", width=256, hidden_layers=2)
    out = tmp_path / "q.onnx"
    result = quantize(fp32, out, calibration=None, work_dir=tmp_path / "w")
    assert (result.method, result.per_channel, result.per_channel_fallback_reason) == ("dynamic", True, None)
    assert result.int8_bytes / result.fp32_bytes < 0.3
    assert result.seconds > 0
    verify(out)
    assert any(n.op_type in {"DynamicQuantizeLinear", "MatMulInteger"} for n in onnx.load(str(out)).graph.node)


def test_preprocess_records_what_it_did(tmp_path: Path) -> None:
    fp32 = build_mlp(tmp_path / "m.onnx", width=32, hidden_layers=1)
    source, mode, _ = preprocess(fp32, tmp_path / "pre.onnx")
    assert source == tmp_path / "pre.onnx" and mode in {"full", "no_symbolic_shape"}
    assert "Gemm" in {n.op_type for n in onnx.load(str(source)).graph.node}  # MatMul+Add fused


def test_preprocess_falls_back_to_raw(tmp_path: Path) -> None:
    """A file that is not ONNX makes every pre-processing attempt fail; then the raw
    path is returned and the failures are recorded (quantization then fails loudly)."""
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"not a model")
    source, mode, note = preprocess(bogus, tmp_path / "pre.onnx")
    assert (source, mode) == (bogus, "raw")
    assert note is not None and "no_symbolic_shape failed" in note
    with pytest.raises(QuantizationError, match="per-tensor failed too"):
        quantize(bogus, tmp_path / "q.onnx", calibration=None, work_dir=tmp_path)
    assert not (tmp_path / "q.onnx").exists()


def test_shorten_keeps_type_and_first_line() -> None:
    assert shorten(ValueError("first\nsecond")) == "ValueError: first"
    assert len(shorten(RuntimeError("x" * 1000))) == 200
