"""The samples of one push: what calibrates the static recipes and what the guard judges on.

The guard judges on real inputs whenever it has them, best first:

1. ``--eval FILE``: the operator's evaluation set (the model's inputs, plus a
   ``label`` array for task accuracy), all of it;
2. the held-out split of ``--calibration`` (never used to calibrate); when no
   recipe of the push calibrates (dynamic INT8), the whole calibration file;
3. inputs generated from what the graph says (``central.quantize.synthetic``),
   as many as the sample budget allows and at least as many as the threshold's
   lower bound needs.

Static recipes calibrate on the calibration split (on the whole file when an eval set
judges), or, for a CNN without data, on generated images made with another seed than the
guard's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from central.errors import BadRequest
from central.quantize.calibration import MIN_HELD_OUT, Samples, input_arrays, load_calibration, read_npz, split
from central.quantize.synthetic import InputHints, Sizes, elements_per_sample, generated_samples
from fleetwire.manifest import TensorSpec

LABEL_NAMES = ("label", "labels")
SampleSource = Literal["eval", "held-out", "calibration-file", "generated"]


@dataclass(frozen=True)
class Generation:
    """How many inputs to make up, and how."""

    samples: int
    #: Cap on generated values (all inputs, all samples) so big inputs stay in memory.
    max_elements: int
    #: Never fewer than this many guard samples (what the threshold's bound needs).
    min_samples: int
    calibration_samples: int
    seed: int
    sizes: Sizes = field(default_factory=Sizes)


@dataclass(frozen=True)
class PushSamples:
    """Calibration part (None: nothing calibrates), guard inputs, labels if any."""

    calibration: Samples | None
    guard: Samples
    labels: np.ndarray | None
    source: SampleSource
    report: dict[str, Any]


def load_eval(path: Path, inputs: list[TensorSpec]) -> tuple[Samples, np.ndarray | None]:
    """The eval file's input arrays and its labels (``label``, class ids, one per sample)."""
    raw = read_npz(path, "eval")
    arrays, count = input_arrays(raw, inputs, "eval")
    if count < MIN_HELD_OUT:
        raise BadRequest(f"eval file has {count} samples; at least {MIN_HELD_OUT} are needed")
    name = next((n for n in LABEL_NAMES if n in raw), None)
    if name is None:
        return arrays, None
    labels = raw[name]
    if labels.ndim != 1 or labels.shape[0] != count or not np.issubdtype(labels.dtype, np.integer):
        raise BadRequest(
            f"eval array {name!r} must hold {count} integer class ids, got {labels.dtype} {list(labels.shape)}"
        )
    return arrays, labels


def _whole(n: int, fixed_batch: int) -> int:
    """``n`` rounded up to whole batches of a fixed batch dimension."""
    return -(-n // fixed_batch) * fixed_batch if fixed_batch > 0 else n


def guard_sample_count(inputs: list[TensorSpec], hints: InputHints, gen: Generation) -> int:
    """``gen.samples``, fewer when they would exceed ``max_elements``, never below ``min_samples``."""
    per_sample = max(1, elements_per_sample(inputs, hints, gen.sizes))
    return max(gen.min_samples, min(gen.samples, gen.max_elements // per_sample))


def _generated(inputs: list[TensorSpec], hints: InputHints, gen: Generation, fixed_batch: int) -> Samples:
    n = _whole(guard_sample_count(inputs, hints, gen), fixed_batch)
    return generated_samples(inputs, n, gen.seed, hints=hints, sizes=gen.sizes)


def _calibration_part(
    inputs: list[TensorSpec], hints: InputHints, gen: Generation, fixed_batch: int, generate: bool
) -> Samples | None:
    if not generate:
        return None
    n = _whole(gen.calibration_samples, fixed_batch)
    return generated_samples(inputs, n, gen.seed + 1, hints=hints, sizes=gen.sizes)


def push_samples(
    inputs: list[TensorSpec], hints: InputHints, gen: Generation, *,
    calibration: Path | None, eval_data: Path | None, static: bool, generate_calibration: bool, fixed_batch: int = 0,
) -> PushSamples:  # fmt: skip
    """Everything the quantize and guard steps need (see the module docstring).

    ``static``: a recipe of this push calibrates; ``generate_calibration``: with no
    calibration file, make images up for it (CNNs)."""
    report: dict[str, Any] = {"calibration_samples": 0}
    labels: np.ndarray | None = None
    calib: Samples | None = None
    held: Samples | None = None
    if calibration is not None:
        data = load_calibration(calibration, inputs)
        report["calibration_ignored"] = data.ignored
        if eval_data is not None:  # the guard judges on the eval set: every sample calibrates
            calib, held = (data.arrays if static else None), None
        else:
            calib, held = split(data, gen.min_samples) if static else (None, data.arrays)
    elif static:
        calib = _calibration_part(inputs, hints, gen, fixed_batch, generate_calibration)
        report["calibration_source"] = "generated" if calib is not None else None
    if calib is not None:
        report["calibration_samples"] = int(next(iter(calib.values())).shape[0])
    if eval_data is not None:
        guard, labels = load_eval(eval_data, inputs)
        source: SampleSource = "eval"
    elif held is not None:
        guard, source = held, ("held-out" if static else "calibration-file")
    else:
        guard, source = _generated(inputs, hints, gen, fixed_batch), "generated"
    report["samples_source"] = source
    return PushSamples(calib, guard, labels, source, report)
