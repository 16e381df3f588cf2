"""How far an INT8 artifact's outputs agree with its FP32 reference, per sample.

One definition for central's accuracy guard (``central.quantize.guard``, on calibration or
eval samples before a rollout) and for the edge's shadow sampling (``edge_node.inference.shadow``,
on live requests after it), so both judge INT8 by the same numbers.

Classifiers are compared by top-1: the label output if the model has one (an integer tensor
``[N]``, as skl2onnx exports), else the argmax of the first float ``[N, C≥2]`` output. Their
continuous measure is the per-sample cosine similarity of that float ``[N, C≥2]`` output.
Anything else is compared by the relative L2 error over the float outputs, reported as
``max(0, 1 - error)`` so one threshold serves every measure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "Agreement",
    "classifier_output",
    "cosine",
    "decisions",
    "per_sample",
    "relative_error",
    "relative_errors",
    "scores_output",
]

INT_DTYPES = frozenset({"int64", "int32"})
FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})


class OutputSpec(Protocol):
    """What agreement reads of an output's declared signature (``fleetwire.manifest.TensorSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> Sequence[object]: ...


def scores_output(outputs: Sequence[OutputSpec], values: Sequence[np.ndarray]) -> int | None:
    """The first float ``[N, C≥2]`` output (logits or probabilities), if any."""
    for i, spec in enumerate(outputs):
        if spec.dtype in FLOAT_DTYPES and values[i].ndim == 2 and values[i].shape[1] >= 2:
            return i
    return None


def classifier_output(outputs: Sequence[OutputSpec], values: Sequence[np.ndarray]) -> tuple[int, str] | None:
    """(index, how) of the output that carries the decision, or None for non-classifiers."""
    for i, spec in enumerate(outputs):
        if spec.dtype in INT_DTYPES and len(spec.shape) == 1:
            return i, "label"
    scores = scores_output(outputs, values)
    return None if scores is None else (scores, "argmax")


def decisions(values: Sequence[np.ndarray], found: tuple[int, str]) -> np.ndarray:
    """Per-sample class decisions of a classifier's outputs."""
    index, how = found
    return np.asarray(values[index]) if how == "label" else np.argmax(values[index], axis=1)


def cosine(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per-row cosine similarity; 1 where both rows are zero, 0 where only one is."""
    a, b = ref.astype(np.float64), got.astype(np.float64)
    norm_a, norm_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    norms = norm_a * norm_b
    dots = np.sum(a * b, axis=1)
    both_zero = (norm_a == 0) & (norm_b == 0)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(both_zero, 1.0, 0.0))


def _compared(outputs: Sequence[OutputSpec]) -> list[int]:
    """The float outputs (all outputs if none is float): what the relative error covers."""
    return [i for i, spec in enumerate(outputs) if spec.dtype in FLOAT_DTYPES] or list(range(len(outputs)))


def relative_error(
    outputs: Sequence[OutputSpec], ref: Sequence[np.ndarray], got: Sequence[np.ndarray]
) -> tuple[float, list[str]]:
    """||int8 − fp32||₂ / ||fp32||₂ over the float outputs of a whole batch, and their names."""
    chosen = _compared(outputs)
    diff = sum(float(np.sum((got[i].astype(np.float64) - ref[i].astype(np.float64)) ** 2)) for i in chosen)
    norm = sum(float(np.sum(ref[i].astype(np.float64) ** 2)) for i in chosen)
    names = [outputs[i].name for i in chosen]
    if norm == 0.0:
        return (0.0 if diff == 0.0 else float("inf")), names
    return float(np.sqrt(diff / norm)), names


def relative_errors(outputs: Sequence[OutputSpec], ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> np.ndarray:
    """``relative_error`` of each sample (row) on its own: 0 where both are zero, inf where only FP32 is."""
    rows = int(ref[0].shape[0]) if ref[0].ndim else 1
    diff, norm = np.zeros(rows), np.zeros(rows)
    for i in _compared(outputs):
        a = np.asarray(ref[i], dtype=np.float64).reshape(rows, -1)
        b = np.asarray(got[i], dtype=np.float64).reshape(rows, -1)
        diff += np.sum((b - a) ** 2, axis=1)
        norm += np.sum(a**2, axis=1)
    safe = np.where(norm > 0, norm, 1.0)
    return np.where(norm > 0, np.sqrt(diff / safe), np.where(diff == 0, 0.0, np.inf))


@dataclass(frozen=True)
class Agreement:
    """Per-sample agreement of one batch: ``top1`` (None for non-classifiers) and ``values`` of
    the measure named ``measure`` (``cosine`` or ``relative_error`` as ``max(0, 1 - error)``)."""

    top1: np.ndarray | None
    values: np.ndarray
    measure: str


def per_sample(outputs: Sequence[OutputSpec], ref: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> Agreement:
    """INT8 (``got``) against FP32 (``ref``) on one batch, sample by sample: top-1 equality for
    classifiers, and cosine (floored at 0) where they have a float scores output, else
    max(0, 1 − relative error)."""
    found = classifier_output(outputs, ref)
    top1 = None if found is None else np.asarray(decisions(ref, found) == decisions(got, found))
    scores = scores_output(outputs, ref) if found is not None else None
    if scores is not None:
        # Floored at 0 like the relative error: an opposite row is as wrong as an unrelated one,
        # and the sums stay non-negative (``ShadowInfo``).
        return Agreement(top1, np.maximum(0.0, cosine(ref[scores], got[scores])), "cosine")
    values = np.maximum(0.0, 1.0 - relative_errors(outputs, ref, got))
    return Agreement(top1, values, "relative_error")
