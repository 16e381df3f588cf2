"""The accuracy guard's measurements: does INT8 make the same calls as FP32?

For classifiers the decision is what matters, so they are compared by top-1: the
label output if the model has one (an integer tensor ``[N]``, as skl2onnx exports),
else the argmax of the first float ``[N, C≥2]`` output. Top-1 alone misses INT8
that keeps the argmax but garbles the scores, so classifiers are also compared by a
continuous measure: the per-sample cosine similarity of their first float ``[N, C≥2]``
output (logits or probabilities). Anything else is compared by the relative L2
error over all float outputs, reported as ``max(0, 1 - error)`` so one threshold
serves every measure. Bounds and the decision are in ``central.quantize.verdict``.

On *generated* inputs top-1 is counted only where FP32 decides clearly (its top two
probabilities at least ``DECISIVE_MARGIN`` apart): generated inputs are off the data's
manifold, most of them near-ties that any rounding flips (a digits CNN: 91 % top-1
agreement on generated images, 100 % on the real test set, cosine 0.999 on both). When
too few generated samples are decisive for the bound to reach the threshold at all, top-1
is reported and not judged, and cosine decides. On real data (eval or held-out
calibration samples) every sample counts.
With labels (``--eval``) the task accuracy of both models is reported too. Both
models run in onnxruntime CPU sessions with every graph optimisation, as edges run
them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from central.errors import BadRequest
from central.quantize.calibration import Samples, batches
from central.quantize.verdict import Measure, mean_lower_bound, samples_needed, wilson_lower_bound
from fleetwire.agreement import classifier_output, cosine, decisions, relative_error, scores_output
from fleetwire.manifest import TensorSpec

GUARD_BATCH = 64
#: FP32's top-1 probability minus its runner-up's, at or above which a generated sample counts for top-1.
DECISIVE_MARGIN = 0.5


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


def _probabilities(scores: np.ndarray) -> np.ndarray:
    """Rows as probabilities: as they are when they already are, else a softmax of logits."""
    x = scores.astype(np.float64)
    if np.all(x >= 0) and np.allclose(x.sum(axis=1), 1.0, atol=1e-3):
        return x
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def decisive(scores: np.ndarray) -> np.ndarray:
    """Per sample: FP32's top-1 probability beats its runner-up's by ``DECISIVE_MARGIN``."""
    top2 = np.sort(_probabilities(scores), axis=1)[:, -2:]
    return np.asarray(top2[:, 1] - top2[:, 0] >= DECISIVE_MARGIN)


def _top1(
    same: np.ndarray, found: tuple[int, str], name: str, scores: np.ndarray | None, generated: bool, z: float,
    threshold: float,
) -> Measure:  # fmt: skip
    """Top-1 agreement; on generated inputs over the decisive samples only (module docstring)."""
    detail = f"{found[1]} of output {name!r}"
    if not generated or scores is None:
        return Measure(
            "top1", float(np.mean(same)), wilson_lower_bound(int(np.sum(same)), same.size, z), same.size, detail
        )
    kept = same[decisive(scores)]
    count = int(kept.size)
    detail += f", {count} of {same.size} generated samples where FP32 decides by >= {DECISIVE_MARGIN}"
    value = float(np.mean(kept)) if count else 0.0
    gates = count >= samples_needed(threshold, z)
    if not gates:
        detail += " (too few to judge: reported only)"
    return Measure("top1", value, wilson_lower_bound(int(np.sum(kept)), count, z), count, detail, gates)


def compare(
    outputs: list[TensorSpec], ref: list[np.ndarray], got: list[np.ndarray], z: float,
    *, generated: bool = False, threshold: float = 0.0,
) -> list[Measure]:  # fmt: skip
    """The measures of INT8 (``got``) against FP32 (``ref``): top-1 and cosine for
    classifiers, 1 − relative L2 error otherwise (see the module docstring). ``generated``:
    the samples were made up, so top-1 counts decisive ones only (``threshold`` says how
    many are enough to judge)."""
    count = int(ref[0].shape[0]) if ref[0].ndim else 1
    found = classifier_output(outputs, ref)
    if found is None:
        error, compared = relative_error(outputs, ref, got)
        value = max(0.0, 1.0 - error)
        detail = f"relative L2 error {error:.4g} over outputs {compared}"
        return [Measure("relative_error", value, value, count, detail)]
    same = np.asarray(decisions(ref, found) == decisions(got, found))
    scores = scores_output(outputs, ref)
    fp32_scores = ref[scores] if scores is not None else None
    measures = [_top1(same, found, outputs[found[0]].name, fp32_scores, generated, z, threshold)]
    if scores is not None:
        cosines = cosine(ref[scores], got[scores])
        detail = f"cosine of output {outputs[scores].name!r} per sample"
        measures.append(Measure("cosine", float(np.mean(cosines)), mean_lower_bound(cosines, z), count, detail))
    return measures


def accuracy(outputs: list[TensorSpec], values: list[np.ndarray], labels: np.ndarray) -> float:
    """Share of samples whose decision equals the label; ``BadRequest`` for non-classifiers."""
    found = classifier_output(outputs, values)
    if found is None:
        raise BadRequest("eval labels need a classifier: the model has no label output and no [N, classes] scores")
    chosen = decisions(values, found)
    return float(np.mean(chosen == labels[: chosen.shape[0]]))
