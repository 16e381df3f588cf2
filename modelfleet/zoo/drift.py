"""A classifier whose static INT8 form is right on its calibration data and wrong on drifted inputs.

The INT8 accuracy guard checks agreement with FP32 on the calibration samples a push brings; it
cannot see live traffic. This model makes the gap visible on purpose, for the shadow-sampling
benchmark (``bench.rollout``'s third part) and its tests:

- Inputs live in [0, 1]: each class has a prototype whose features are either ``LOW`` or
  ``HIGH`` (as many ``HIGH`` as ``LOW``, so every prototype has the same norm), and a sample
  is its prototype plus a little noise, clipped to [0, 1].
- The graph is a one-hidden-layer MLP: ``relu(x @ I)`` then a nearest-prototype head,
  ``logits_c = h · p_c − |p_c|² / 2``. Prototypes are far apart, so margins are wide and INT8
  agrees with FP32 on calibration-like data.
- Static quantization calibrates the input's and the hidden layer's ranges on [0, 1]. Live
  inputs scaled by ``SHIFT`` (×10) push every feature past 1 (``LOW`` × 10 > 1): INT8 clips them
  all to the same vector and answers one class for everything, while FP32, which does not clip,
  still tells the classes apart (with equal prototype norms, ``argmax`` of ``10 x · p_c`` is the
  prototype nearest ``x``). Top-1 agreement falls to about 1 / ``classes``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DRIFT_SHIFT", "DriftClassifier", "build_drift_classifier", "drift_samples"]

OPSET = 17
INPUT_NAME = "input"
LOW, HIGH = 0.15, 0.85
NOISE = 0.05
#: How much live inputs are scaled by in the drifted distribution.
DRIFT_SHIFT = 10.0


@dataclass(frozen=True)
class DriftClassifier:
    """The model file, its calibration file (``.npz``, named as the input) and its prototypes."""

    onnx_path: Path
    calibration_path: Path
    prototypes: np.ndarray
    input_name: str = INPUT_NAME


def _prototypes(features: int, classes: int, seed: int) -> np.ndarray:
    """``classes`` distinct vectors of ``LOW``/``HIGH``, half of each (equal norms)."""
    rng = np.random.default_rng(seed)
    base = np.array([HIGH] * (features // 2) + [LOW] * (features - features // 2), dtype=np.float32)
    out: list[np.ndarray] = []
    while len(out) < classes:
        candidate = rng.permutation(base)
        if all(np.abs(candidate - p).sum() > features * (HIGH - LOW) / 4 for p in out):
            out.append(candidate)
    return np.stack(out)


def drift_samples(
    prototypes: np.ndarray, count: int, *, shift: float = 1.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` inputs (float32 ``[count, features]``) and their classes; ``shift`` > 1 gives
    the drifted live distribution (the same samples, scaled)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(prototypes), size=count)
    noise = rng.normal(0.0, NOISE, size=(count, prototypes.shape[1]))
    x = np.clip(prototypes[labels] + noise, 0.0, 1.0) * shift
    return x.astype(np.float32), labels


def _graph(prototypes: np.ndarray) -> onnx.ModelProto:
    classes, features = prototypes.shape
    w1 = np.eye(features, dtype=np.float32)
    b1 = np.zeros(features, dtype=np.float32)
    w2 = prototypes.T.astype(np.float32)
    b2 = (-0.5 * (prototypes**2).sum(axis=1)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w0"), (b1, "b0"), (w2, "w1"), (b2, "b1"))]
    nodes = [
        helper.make_node("MatMul", [INPUT_NAME, "w0"], ["mm0"]),
        helper.make_node("Add", ["mm0", "b0"], ["add0"]),
        helper.make_node("Relu", ["add0"], ["relu0"]),
        helper.make_node("MatMul", ["relu0", "w1"], ["mm1"]),
        helper.make_node("Add", ["mm1", "b1"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "drift_classifier",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelfleet.zoo")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def build_drift_classifier(
    directory: Path, *, features: int = 32, classes: int = 4, calibration_samples: int = 1200, seed: int = 0
) -> DriftClassifier:
    """Write ``model.onnx`` and ``calibration.npz`` (inputs in [0, 1]) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    prototypes = _prototypes(features, classes, seed)
    onnx_path = directory / "model.onnx"
    onnx.save(_graph(prototypes), str(onnx_path))
    x, _ = drift_samples(prototypes, calibration_samples, seed=seed + 1)
    buffer = io.BytesIO()
    np.savez(buffer, **{INPUT_NAME: x})  # type: ignore[arg-type]
    calibration_path = directory / "calibration.npz"
    calibration_path.write_bytes(buffer.getvalue())
    return DriftClassifier(onnx_path, calibration_path, prototypes)
