"""What the quantize step hands the guard step through ``PushContext.quantize_plan``.

Two pipeline steps rather than one so that a push's progress says which of them
failed: "quantize" when no recipe gave a loadable model, "guard" when INT8 does not
keep FP32's accuracy."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from central.quantize.family import Family
from central.quantize.quantizer import Calibration, QuantizationResult, Source
from central.quantize.recipes import Recipe
from central.quantize.samples import PushSamples
from central.quantize.verdict import GuardVerdict


@dataclass
class Int8Candidate:
    """One INT8 artifact: its recipe, its file, how it was made."""

    recipe: Recipe
    path: Path
    result: QuantizationResult


@dataclass
class QuantizePlan:
    """One push's quantization so far: family, source, samples, candidates."""

    family: Family
    source: Source
    samples: PushSamples
    calibration: Calibration | None
    #: Nodes to keep in FP32 when the whole graph in INT8 fails the guard.
    sensitive: list[str]
    threshold: float
    confidence: float
    flags: frozenset[str]
    #: Batch size of guard runs, and whether the model's batch dimension is fixed.
    batch_size: int
    fixed_batch: bool
    candidates: dict[str, Int8Candidate] = field(default_factory=dict)
    #: Recipes that gave no loadable model, with the reason.
    failed: dict[str, str] = field(default_factory=dict)
    quantize_seconds: float = 0.0
    #: The guard step's findings: a verdict per candidate, task accuracy per artifact
    #: ("fp32" included) when the eval data has labels.
    verdicts: dict[str, GuardVerdict] = field(default_factory=dict)
    accuracies: dict[str, float] = field(default_factory=dict)
    guard_seconds: float | None = None
    #: What ``central.quantize.normalize`` changed when the graph as pushed failed a
    #: recipe and every recipe was tried again on the cleaned one (None: not needed).
    normalized: dict[str, Any] | None = None
