"""The guard's verdict: lower confidence bounds against one threshold.

A point estimate on a handful of samples says little (13 of 13 agreeing is
consistent with a model that disagrees on one input in five), so every measure is
compared with the threshold through a one-sided lower confidence bound at
``confidence`` (95 % by default):

* top-1 agreement, a share of n samples: the **Wilson score** bound, which stays
  sensible at 100 % agreement and small n (n/(n + z²) when all agree: 256 samples
  can prove at most 98.96 %, 90 samples 97.1 %);
* per-sample similarities (cosine): mean − z·sd/√n;
* the relative L2 error over every element of every sample is already an
  aggregate; its bound is the value itself.

INT8 passes when every measure's bound reaches the threshold; the measure with the
smallest margin is the one that *decided*, and the report names it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

MeasureName = Literal["top1", "cosine", "relative_error"]
LABELS: dict[str, str] = {"top1": "top-1 agreement", "cosine": "cosine similarity", "relative_error": "1 - relative L2"}


def z_score(confidence: float) -> float:
    """The one-sided normal quantile: 1.645 for 0.95."""
    return NormalDist().inv_cdf(confidence)


def wilson_lower_bound(successes: int, n: int, z: float) -> float:
    """Lower end of the Wilson score interval for ``successes`` out of ``n``."""
    if n <= 0:
        return 0.0
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z2 / n))


def mean_lower_bound(values: np.ndarray, z: float) -> float:
    """mean − z·sd/√n of per-sample values (the mean itself for one sample)."""
    n = int(values.size)
    if n == 0:
        return 0.0
    mean = float(np.mean(values))
    if n == 1:
        return mean
    return mean - z * float(np.std(values, ddof=1)) / math.sqrt(n)


def samples_needed(threshold: float, z: float) -> int:
    """The fewest samples whose Wilson bound can reach ``threshold`` when all agree."""
    if threshold >= 1.0:
        return 1 << 31
    return math.ceil(z * z * threshold / (1.0 - threshold)) + 1


@dataclass(frozen=True)
class Measure:
    """One comparison of INT8 with FP32 on the guard's samples."""

    name: MeasureName
    #: The point estimate (share of equal decisions, mean cosine, 1 - relative error).
    value: float
    #: What is compared with the threshold (see the module docstring).
    lower_bound: float
    samples: int
    #: Which output, how; for the report and the error message.
    detail: str
    #: Whether the threshold applies to it; a measure that cannot mean anything on these
    #: samples (top-1 on too few decisive generated inputs) is reported, not judged.
    gates: bool = True

    def as_dict(self) -> dict[str, Any]:
        out = {"value": self.value, "lower_bound": self.lower_bound, "samples": self.samples, "detail": self.detail}
        return out if self.gates else {**out, "judged": False}


@dataclass(frozen=True)
class GuardVerdict:
    """Every measure, the threshold, and which measure decided."""

    passed: bool
    decided_by: Measure
    measures: list[Measure]
    threshold: float

    def report(self) -> dict[str, Any]:
        """The guard's entries of a report (the deciding measure's figures at the top)."""
        d = self.decided_by
        return {
            "passed": self.passed,
            "metric": d.name,
            "decided_by": d.name,
            "agreement": d.value,
            "lower_bound": d.lower_bound,
            "samples": d.samples,
            "detail": d.detail,
            "threshold": self.threshold,
            "measures": {m.name: m.as_dict() for m in self.measures},
        }


def judge(measures: list[Measure], threshold: float) -> GuardVerdict:
    """Pass when every judged measure's bound reaches ``threshold``; the smallest margin decides."""
    deciding = min((m for m in measures if m.gates), key=lambda m: m.lower_bound - threshold)
    return GuardVerdict(deciding.lower_bound >= threshold, deciding, measures, threshold)
