"""The accuracy guard's measurement: how often INT8 makes the same call as FP32.

For classifiers the decision is what matters, not the logits, so they are compared by
top-1: the label output if the model has one (an integer tensor ``[N]``, as skl2onnx
exports), else the argmax of the first float ``[N, C≥2]`` output. Anything else is
compared by relative L2 error over all float outputs, reported as
``agreement = max(0, 1 - error)`` so one threshold serves both. Both models run in
onnxruntime CPU sessions with every graph optimisation, as edges run them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from central.errors import BadRequest
from central.quantize.calibration import Samples, batches
from fleetwire.manifest import TensorSpec

GUARD_BATCH = 64
_INT_DTYPES = {"int64", "int32"}
_FLOAT_DTYPES = {"float32", "float16", "float64", "bfloat16"}


@dataclass(frozen=True)
class Agreement:
    """One comparison of INT8 against FP32 on the same samples."""

    metric: Literal["top1", "relative_error"]
    #: 0..1: the share of equal top-1 decisions, or ``max(0, 1 - relative error)``.
    agreement: float
    samples: int
    #: Which output was compared, how; for the report and the error message.
    detail: str


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_outputs(path: Path, samples: Samples, names: list[str], size: int, fixed_batch: bool) -> list[np.ndarray]:
    """Every named output over all samples, run in batches and concatenated."""
    session = _session(path)
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for batch in batches(samples, size, drop_partial=fixed_batch):
        for store, value in zip(parts, session.run(names, batch), strict=True):
            store.append(np.asarray(value))
    if not parts or not parts[0]:
        raise BadRequest(f"no complete batch of {size} samples to compare INT8 with FP32 on")
    return [np.concatenate(p) if p[0].ndim else np.stack(p) for p in parts]


def _classifier_output(outputs: list[TensorSpec], values: list[np.ndarray]) -> tuple[int, str] | None:
    """(index, how) of the output that carries the decision, or None for non-classifiers."""
    for i, spec in enumerate(outputs):
        if spec.dtype in _INT_DTYPES and len(spec.shape) == 1:
            return i, "label"
    for i, spec in enumerate(outputs):
        if spec.dtype in _FLOAT_DTYPES and values[i].ndim == 2 and values[i].shape[1] >= 2:
            return i, "argmax"
    return None


def _top1(ref: np.ndarray, got: np.ndarray, how: str) -> np.ndarray:
    """Per-sample equality of the decisions."""
    if how == "label":
        return np.asarray(ref == got)
    return np.asarray(np.argmax(ref, axis=1) == np.argmax(got, axis=1))


def _relative_error(outputs: list[TensorSpec], ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, list[str]]:
    """||int8 − fp32||₂ / ||fp32||₂ over the float outputs (all outputs if none is float)."""
    chosen = [i for i, spec in enumerate(outputs) if spec.dtype in _FLOAT_DTYPES] or list(range(len(outputs)))
    diff = sum(float(np.sum((got[i].astype(np.float64) - ref[i].astype(np.float64)) ** 2)) for i in chosen)
    norm = sum(float(np.sum(ref[i].astype(np.float64) ** 2)) for i in chosen)
    if norm == 0.0:
        return (0.0 if diff == 0.0 else float("inf")), [outputs[i].name for i in chosen]
    return float(np.sqrt(diff / norm)), [outputs[i].name for i in chosen]


def measure_agreement(
    fp32: Path,
    int8: Path,
    samples: Samples,
    outputs: list[TensorSpec],
    *,
    batch_size: int = GUARD_BATCH,
    fixed_batch: bool = False,
) -> Agreement:
    """Run both models on ``samples`` and compare them (see the module docstring)."""
    names = [spec.name for spec in outputs]
    ref = run_outputs(fp32, samples, names, batch_size, fixed_batch)
    got = run_outputs(int8, samples, names, batch_size, fixed_batch)
    count = int(ref[0].shape[0]) if ref[0].ndim else 1
    found = _classifier_output(outputs, ref)
    if found is not None:
        index, how = found
        same = _top1(ref[index], got[index], how)
        detail = f"{how} of output {names[index]!r}"
        return Agreement("top1", float(np.mean(same)), count, detail)
    error, compared = _relative_error(outputs, ref, got)
    detail = f"relative L2 error {error:.4g} over outputs {compared}"
    return Agreement("relative_error", max(0.0, 1.0 - error), count, detail)
