"""central.quantize.guard: top-1 and cosine for classifiers, relative error otherwise,
task accuracy with labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from quant_models import digits_model

from central.errors import BadRequest
from central.quantize import quantize
from central.quantize.guard import accuracy, compare, run_outputs
from central.quantize.verdict import Measure, judge, wilson_lower_bound, z_score
from central.registry.validate import signature
from fleetwire.manifest import TensorSpec
from modelfleet.zoo import build_mlp
from modelfleet.zoo.digits import DigitsModel

Z95 = z_score(0.95)


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    return digits_model(tmp_path_factory)


def measure(
    fp32: Path, int8: Path, samples: dict[str, np.ndarray], outputs: list[TensorSpec], *,
    batch_size: int = 64, fixed_batch: bool = False,
) -> dict[str, Measure]:  # fmt: skip
    """Both models on the samples, compared as the guard step compares them."""
    names = [spec.name for spec in outputs]
    ref = run_outputs(fp32, samples, names, batch_size, fixed_batch)
    got = run_outputs(int8, samples, names, batch_size, fixed_batch)
    return {m.name: m for m in compare(outputs, ref, got, Z95)}


def _save(path: Path, nodes: list[onnx.NodeProto], weights: dict[str, np.ndarray], width: int, out: int) -> Path:
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out])],
        initializer=[numpy_helper.from_array(w, name) for name, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def fragile_classifier(path: Path) -> Path:
    """Logits of classes 0-8 are ~0.01·x; class 9's are -100·Σx. The calibrated output
    range is then ~[-1600, 0.1], its INT8 step ~6, so every small logit rounds to the
    same value and INT8's argmax is a tie: on purpose, deterministically wrong."""
    w = (np.random.default_rng(0).standard_normal((16, 10)) * 0.01).astype(np.float32)
    w[:, 9] = -100.0
    return _save(path, [helper.make_node("MatMul", ["input", "w"], ["y"])], {"w": w}, 16, 10)


def regressor(path: Path) -> Path:
    """One float output of width 1: not a classifier, so relative error applies."""
    w = np.random.default_rng(1).standard_normal((8, 1)).astype(np.float32)
    return _save(path, [helper.make_node("MatMul", ["input", "w"], ["y"])], {"w": w}, 8, 1)


def _outputs(path: Path) -> list[TensorSpec]:
    return signature(onnx.load(str(path)))[1]


def test_identical_models_agree(digits: DigitsModel) -> None:
    samples = {"input": digits.test_x}
    result = measure(digits.onnx_path, digits.onnx_path, samples, _outputs(digits.onnx_path))
    assert list(result) == ["top1", "cosine"]
    top1, cosine = result["top1"], result["cosine"]
    assert (top1.value, top1.samples, top1.detail) == (1.0, 450, "label of output 'label'")
    assert top1.lower_bound == pytest.approx(wilson_lower_bound(450, 450, Z95)) and top1.lower_bound < 1.0
    assert cosine.value == pytest.approx(1.0) and cosine.detail == "cosine of output 'probabilities' per sample"


def test_digits_int8_agrees(digits: DigitsModel, tmp_path: Path) -> None:
    with np.load(digits.calibration_path) as npz:
        calibration = {"input": npz["input"]}
    int8 = tmp_path / "q.onnx"
    quantize(digits.onnx_path, int8, calibration=calibration, work_dir=tmp_path)
    result = measure(digits.onnx_path, int8, {"input": digits.test_x}, _outputs(digits.onnx_path))
    assert result["top1"].value >= 0.99 and result["cosine"].lower_bound >= 0.99


def test_fragile_classifier_disagrees(tmp_path: Path) -> None:
    fp32 = fragile_classifier(tmp_path / "fragile.onnx")
    x = np.random.default_rng(2).random((100, 16), dtype=np.float32)
    int8 = tmp_path / "q.onnx"
    quantize(fp32, int8, calibration={"input": x[:80]}, work_dir=tmp_path)
    result = measure(fp32, int8, {"input": x[80:]}, _outputs(fp32))
    assert result["top1"].detail == "argmax of output 'y'" and result["top1"].value < 0.5
    # The logits as a whole barely change (class 9's dominates): top-1 is what catches this.
    assert result["cosine"].lower_bound > 0.99


def test_relative_error_for_non_classifiers(tmp_path: Path) -> None:
    fp32 = regressor(tmp_path / "reg.onnx")
    x = np.random.default_rng(3).standard_normal((70, 8), dtype=np.float32)
    int8 = tmp_path / "q.onnx"
    quantize(fp32, int8, calibration={"input": x}, work_dir=tmp_path)
    (result,) = measure(fp32, int8, {"input": x}, _outputs(fp32), batch_size=16).values()
    (ref,) = run_outputs(fp32, {"input": x}, ["y"], 70, False)
    (got,) = run_outputs(int8, {"input": x}, ["y"], 70, False)
    error = float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64)))
    assert result.name == "relative_error" and result.samples == 70
    assert 0.0 < error < 0.05
    assert result.value == result.lower_bound == pytest.approx(1.0 - error, abs=1e-9)


def test_logits_output_uses_argmax(tmp_path: Path) -> None:
    fp32 = build_mlp(tmp_path / "m.onnx", width=32, hidden_layers=1)
    x = np.random.default_rng(4).standard_normal((50, 32), dtype=np.float32)
    top1 = measure(fp32, fp32, {"input": x}, _outputs(fp32), batch_size=7)["top1"]
    assert (top1.value, top1.samples, top1.detail) == (1.0, 50, "argmax of output 'logits'")


def test_no_complete_batch_is_a_bad_request(tmp_path: Path) -> None:
    fp32 = regressor(tmp_path / "reg.onnx")
    x = np.zeros((5, 8), dtype=np.float32)
    with pytest.raises(BadRequest, match="no complete batch of 8"):
        measure(fp32, fp32, {"input": x}, _outputs(fp32), batch_size=8, fixed_batch=True)


def test_task_accuracy_from_labels(digits: DigitsModel) -> None:
    outputs = _outputs(digits.onnx_path)
    values = run_outputs(digits.onnx_path, {"input": digits.test_x}, [o.name for o in outputs], 64, False)
    assert accuracy(outputs, values, digits.test_y) == pytest.approx(digits.fp32_test_accuracy)


def test_accuracy_needs_a_classifier(tmp_path: Path) -> None:
    fp32 = regressor(tmp_path / "reg.onnx")
    outputs = _outputs(fp32)
    values = run_outputs(fp32, {"input": np.zeros((4, 8), np.float32)}, ["y"], 4, False)
    with pytest.raises(BadRequest, match="eval labels need a classifier"):
        accuracy(outputs, values, np.zeros(4, np.int64))


def _logits(rows: list[tuple[float, float]]) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


SCORES = [TensorSpec(name="logits", dtype="float32", shape=[-1, 2])]


def test_generated_near_ties_that_flip_do_not_count_decisive_flips_do() -> None:
    """On generated inputs only samples FP32 decides clearly count for top-1: a flip of a
    near-tie is rounding, a flip of a clear decision is an error."""
    clear, tie = (4.0, -4.0), (0.01, -0.01)
    ref = _logits([clear] * 40 + [tie] * 10)
    tie_flipped = _logits([clear] * 40 + [(-0.01, 0.01)] * 10)
    z = z_score(0.95)
    (top1, _) = compare(SCORES, [ref], [tie_flipped], z, generated=True, threshold=0.5)
    assert (top1.value, top1.samples, top1.gates) == (1.0, 40, True)
    (real, _) = compare(SCORES, [ref], [tie_flipped], z)  # real data: every sample counts
    assert (real.value, real.samples) == (0.8, 50)
    clear_flipped = _logits([(-4.0, 4.0)] * 4 + [clear] * 36 + [tie] * 10)
    (top1, _) = compare(SCORES, [ref], [clear_flipped], z, generated=True, threshold=0.5)
    assert (top1.value, top1.samples) == (0.9, 40)


def test_too_few_decisive_generated_samples_leave_top1_unjudged_and_cosine_decides() -> None:
    ref = _logits([(4.0, -4.0)] * 5 + [(0.01, -0.01)] * 95)
    got = _logits([(4.0, -4.0)] * 5 + [(-0.01, 0.01)] * 95)  # every tie flipped
    measures = compare(SCORES, [ref], [got], z_score(0.95), generated=True, threshold=0.97)
    top1 = next(m for m in measures if m.name == "top1")
    assert top1.samples == 5 and not top1.gates and "reported only" in top1.detail
    verdict = judge(measures, 0.97)
    assert verdict.decided_by.name == "cosine"
    assert verdict.report()["measures"]["top1"]["judged"] is False
