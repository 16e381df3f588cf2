"""Judging INT8 against FP32 on live traffic, from the counts edges report.

The guard let INT8 through because every measure's *lower* confidence bound reached the
threshold on central's samples. Live traffic may differ, so each edge runs a sample of
its requests on both artifacts and reports counts and sums
(:class:`fleetwire.mqtt.payloads.ShadowInfo`). Here the test is turned around: a node, or
the version fleet-wide with the nodes' counts pooled, is *flagged* when a measure's
**upper** bound at the guard's confidence falls below the guard's threshold, i.e. when
we are confident agreement is below it; a handful of unlucky samples flags nothing.

* top-1 agreement: the Wilson score upper bound, sensible at 0 % and at small n;
* the continuous measure (cosine, or 1 − relative L2): mean + z·sd/√n from the sum and
  the sum of squares.

A language model's counts (``edge_node.generation.shadow``) are per served token: ``top1_*``
is **greedy agreement** (the reference's argmax is the token served, on greedy requests),
judged exactly as top-1 against the text guard's ``min_greedy_agreement`` (0.90, or the push's
``--threshold``) at its confidence (:func:`guard_threshold` reads the artifact's
``text_guard``); the served tokens' mean log-probability under FP32 (``token_nll``) is
reported (:func:`token_logprob`), not judged: a sampled token's probability has no threshold
the guard set (its perplexity ratio compares two models on the same text, and live text has
only the served artifact's). Like the guard, it counts tokens as independent samples.

Every look at a growing count is another chance of a false alarm, so nothing is judged
before :data:`MIN_LIVE_SAMPLES` samples; with agreement near 0.5 against a 0.99
threshold that many already flag it (the aim: a large drop found within about 20
samples, 2,000 requests at a 1 % sample)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from central.quantize.verdict import LABELS, z_score
from fleetwire.mqtt.payloads import ShadowInfo

__all__ = [
    "LIVE_CONFIDENCE",
    "MIN_LIVE_SAMPLES",
    "ShadowPolicy",
    "ShadowVerdict",
    "guard_threshold",
    "guard_z",
    "judge_fleet",
    "judge_node",
    "judging_terms",
    "mean_upper_bound",
    "pool",
    "samples_to_flag",
    "token_logprob",
    "wilson_upper_bound",
]

MeasureName = Literal["top1", "cosine", "relative_error"]
#: ``ShadowInfo.measure`` of a language model (``edge_node.generation.shadow``).
TOKEN_NLL = "token_nll"
#: No verdict on fewer live samples than this (per measure), however bad they look.
MIN_LIVE_SAMPLES = 10
#: The least confidence live samples are judged at by default. The guard looks once; a
#: rollout looks at every heartbeat, and each look is a chance of a false alarm: at the
#: guard's 95 %, a version whose true live agreement is 0.995 against a 0.99 threshold is
#: flagged within 2,000 samples about one time in eight (simulated), at 99.9 % about one in
#: a hundred, while agreement 0.5 is still flagged at 10 samples either way.
LIVE_CONFIDENCE = 0.999
_CAP = 1 << 40


def wilson_upper_bound(successes: int, n: int, z: float) -> float:
    """Upper end of the Wilson score interval for ``successes`` out of ``n`` (1 for n = 0)."""
    return 1.0 if n <= 0 else _wilson_upper(successes / n, n, z)


def _wilson_upper(p: float, n: int, z: float) -> float:
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(max(0.0, p * (1 - p) / n + z2 / (4 * n * n)))
    return min(1.0, (centre + spread) / (1 + z2 / n))


def mean_upper_bound(total: float, total_sq: float, n: int, z: float) -> float:
    """mean + z·sd/√n of per-sample values given their sum and sum of squares.

    Infinite below two samples: one value says nothing about the spread."""
    if n < 2:
        return math.inf
    mean = total / n
    variance = max(0.0, (total_sq - n * mean * mean) / (n - 1))
    return mean + z * math.sqrt(variance / n)


def samples_to_flag(threshold: float, z: float, agreement: float = 0.0) -> int | None:
    """The fewest top-1 samples at which an observed share ``agreement`` is flagged (None: never,
    it is not below the threshold). With ``agreement=0`` it is the least count at which
    anything can be flagged; never fewer than :data:`MIN_LIVE_SAMPLES`."""
    if agreement >= threshold:
        return None

    def flagged(n: int) -> bool:
        return _wilson_upper(agreement, n, z) < threshold

    high = MIN_LIVE_SAMPLES
    while not flagged(high):
        if high > _CAP:
            return None
        high *= 2
    low = MIN_LIVE_SAMPLES - 1
    while high - low > 1:  # the bound falls as n grows at a fixed agreement: bisect
        mid = (low + high) // 2
        low, high = (low, mid) if flagged(mid) else (mid, high)
    return max(MIN_LIVE_SAMPLES, high)


@dataclass(frozen=True)
class ShadowVerdict:
    """Whether live samples show INT8 below the guard's threshold, and the figures."""

    flagged: bool
    #: The measure that decided (smallest margin of its upper bound over the threshold);
    #: None when none had enough samples.
    measure: MeasureName | None
    #: Its point estimate (share agreeing, or mean) and upper bound; None without a measure.
    value: float | None
    bound: float | None
    #: Samples behind the deciding measure (all live samples when none decided).
    samples: int
    threshold: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """For events and the rollout's record."""
        return {
            "flagged": self.flagged,
            "measure": self.measure,
            "value": self.value,
            "bound": self.bound,
            "samples": self.samples,
            "threshold": self.threshold,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class _Bound:
    name: MeasureName
    value: float
    bound: float
    samples: int


def _bounds(info: ShadowInfo, z: float, min_samples: int) -> list[_Bound]:
    out: list[_Bound] = []
    if info.top1_samples >= min_samples:
        n = info.top1_samples
        out.append(_Bound("top1", info.top1_agree / n, wilson_upper_bound(info.top1_agree, n, z), n))
    if info.measure in ("cosine", "relative_error") and info.samples >= max(2, min_samples):
        n = info.samples
        bound = mean_upper_bound(info.measure_sum, info.measure_sumsq, n, z)
        out.append(_Bound(info.measure, info.measure_sum / n, bound, n))  # type: ignore[arg-type]
    return out


def _num(x: float) -> str:
    """0.62, 0.995, 1: up to four decimals, no trailing zeros."""
    return f"{x:.4f}".rstrip("0").rstrip(".")


def judge_node(info: ShadowInfo, threshold: float, z: float, min_samples: int = MIN_LIVE_SAMPLES) -> ShadowVerdict:
    """Flag when some measure's upper bound at ``z`` is below ``threshold``.

    E.g. ``top-1 agreement 0.62 (upper bound 0.81 at 95 %) on 21 live samples < threshold 0.99``."""
    bounds = _bounds(info, z, min_samples)
    if not bounds:
        reason = f"{info.samples} live samples; at least {min_samples} needed before agreement is judged"
        return ShadowVerdict(False, None, None, None, info.samples, threshold, reason)
    d = min(bounds, key=lambda b: b.bound - threshold)
    flagged = d.bound < threshold
    confidence = f"{NormalDist().cdf(z) * 100:.4g} %"
    text = info.measure == TOKEN_NLL
    label = "greedy agreement" if text and d.name == "top1" else LABELS[d.name]
    unit = "served greedy tokens" if text else "live samples"
    figures = f"{label} {_num(d.value)} (upper bound {_num(d.bound)} at {confidence}) on {d.samples} {unit}"
    reason = (
        f"{figures} < threshold {_num(threshold)}" if flagged else f"{figures}; not below threshold {_num(threshold)}"
    )
    return ShadowVerdict(flagged, d.name, d.value, d.bound, d.samples, threshold, reason)


def pool(infos: Iterable[ShadowInfo]) -> ShadowInfo:
    """The nodes' counts added up, for a fleet-wide verdict on a version.

    The continuous measure is pooled over the nodes reporting the most common one (they
    all should: it follows the model); the others add only their top-1 counts."""
    infos = list(infos)
    names = [i.measure for i in infos if i.measure]
    measure = max(set(names), key=names.count) if names else ""
    same = [i for i in infos if i.measure == measure]
    return ShadowInfo(
        samples=sum(i.samples for i in same),
        top1_agree=sum(i.top1_agree for i in infos),
        top1_samples=sum(i.top1_samples for i in infos),
        measure=measure,
        measure_sum=sum(i.measure_sum for i in same),
        measure_sumsq=sum(i.measure_sumsq for i in same),
        dropped=sum(i.dropped for i in infos),
    )


def judge_fleet(
    infos: Iterable[ShadowInfo], threshold: float, z: float, min_samples: int = MIN_LIVE_SAMPLES
) -> ShadowVerdict:
    """:func:`judge_node` on every node's counts pooled, flagged only when the flag still holds
    with any single node's counts left out.

    A node reports its own counts and nothing checks them: pooled as they are, one node's
    invented samples could flag every other node serving the artifact. Leaving each node out of
    the totals in turn (O(nodes)) means one node can flag only itself (:func:`judge_node`), never
    the fleet; a single reporter never makes a fleet flag. The figures are the whole pool's."""
    infos = list(infos)
    total = pool(infos)
    verdict = judge_node(total, threshold, z, min_samples)
    if not verdict.flagged:
        return verdict
    if len(infos) < 2:
        return _unflagged(verdict, "one node's counts alone never flag the fleet")
    for info in infos:
        if not judge_node(_without(total, info), threshold, z, min_samples).flagged:
            return _unflagged(verdict, "not flagged with one node's counts left out")
    return verdict


def _without(total: ShadowInfo, info: ShadowInfo) -> ShadowInfo:
    """``total`` (from :func:`pool`) less one node's ``info``."""
    same = info.measure == total.measure
    return total.model_copy(
        update={
            "samples": max(0, total.samples - info.samples) if same else total.samples,
            "top1_agree": max(0, total.top1_agree - info.top1_agree),
            "top1_samples": max(0, total.top1_samples - info.top1_samples),
            "measure_sum": total.measure_sum - info.measure_sum if same else total.measure_sum,
            "measure_sumsq": max(0.0, total.measure_sumsq - info.measure_sumsq) if same else total.measure_sumsq,
            "dropped": max(0, total.dropped - info.dropped),
        }
    )


def _unflagged(verdict: ShadowVerdict, why: str) -> ShadowVerdict:
    return dataclasses.replace(verdict, flagged=False, reason=f"{verdict.reason}; {why}")


def _pair(block: Any) -> tuple[float, float] | None:
    if not isinstance(block, dict):
        return None
    threshold, confidence = block.get("threshold"), block.get("confidence")
    numbers = (int, float)
    if not (isinstance(threshold, numbers) and isinstance(confidence, numbers)) or isinstance(threshold, bool):
        return None
    if 0 < float(threshold) <= 1 and 0.5 <= float(confidence) < 1:
        return float(threshold), float(confidence)
    return None


def _text_pair(report: dict[str, Any]) -> tuple[float, float] | None:
    """A language model's guard: greedy agreement's minimum, from a candidate's report
    (``text_guard``) or the push's (``thresholds``, ``confidence``: the default artifact's)."""
    guard = report.get("text_guard")
    if isinstance(guard, dict) and isinstance(guard.get("greedy_agreement"), dict):
        return _pair({"threshold": guard["greedy_agreement"].get("min"), "confidence": guard.get("confidence")})
    thresholds = report.get("thresholds")
    if report.get("family") == "decoder" and isinstance(thresholds, dict):
        return _pair({"threshold": thresholds.get("min_greedy_agreement"), "confidence": report.get("confidence")})
    return None


def guard_threshold(quantization: dict[str, Any] | None) -> tuple[float, float] | None:
    """``(threshold, confidence)`` the guard judged an INT8 artifact with, or None.

    Reads an INT8 artifact's report (``ArtifactRef.quantization``: ``guard.threshold`` and
    ``guard.confidence``), a push's report (``Manifest.quantization``: both at the top), or a
    language model's (``text_guard.greedy_agreement.min``, or the push's
    ``thresholds.min_greedy_agreement``, and the confidence); ``z_score(confidence)`` is the z
    to judge live samples with."""
    if not quantization:
        return None
    return _pair(quantization.get("guard")) or _text_pair(quantization) or _pair(quantization)


def token_logprob(info: ShadowInfo, z: float) -> dict[str, Any] | None:
    """A language model's served tokens under the reference: their mean log-probability, its
    lower bound at ``z`` (mean − z·sd/√n over tokens) and the tokens; None for other counts."""
    if info.measure != TOKEN_NLL or info.samples < 1:
        return None
    upper = mean_upper_bound(info.measure_sum, info.measure_sumsq, info.samples, z)
    return {
        "mean": round(-info.measure_sum / info.samples, 6),
        "lower_bound": round(-upper, 6) if math.isfinite(upper) else None,
        "perplexity": round(math.exp(min(info.measure_sum / info.samples, 700.0)), 4),
        "tokens": info.samples,
    }


def guard_z(quantization: dict[str, Any] | None) -> tuple[float, float] | None:
    """``(threshold, z)`` from :func:`guard_threshold`: what :func:`judge_node` takes."""
    pair = guard_threshold(quantization)
    return None if pair is None else (pair[0], z_score(pair[1]))


class ShadowPolicy(BaseModel):
    """The live-agreement part of a rollout request: when INT8 is judged, and what a flag does."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    min_samples: int = Field(MIN_LIVE_SAMPLES, ge=2)
    """Live samples per measure before a node (or the fleet) is judged at all."""
    confidence: float | None = Field(None, ge=0.5, lt=1)
    """The confidence of the upper bound; None: the guard's (as the INT8 artifact's report
    says) or 99.9 %, whichever is higher (see ``LIVE_CONFIDENCE``)."""
    threshold: float | None = Field(None, gt=0, le=1)
    """The agreement INT8 must not be confidently below; None: the guard's threshold."""
    on_flag: Literal["report", "fallback", "roll_back"] = "report"
    """What a flag does: ``report`` only says so (reason and event), ``fallback`` serves the
    reference (FP32) artifact on the flagged nodes, ``roll_back`` rolls the rollout back."""


def judging_terms(policy: ShadowPolicy, quantization: dict[str, Any] | None) -> tuple[float, float] | None:
    """``(threshold, z)`` to judge with: the policy's where set, else the guard's threshold
    and the higher of the guard's confidence and :data:`LIVE_CONFIDENCE`; None without a
    threshold (an artifact the guard never judged, and no override)."""
    guard = guard_threshold(quantization)
    threshold = policy.threshold if policy.threshold is not None else (guard[0] if guard else None)
    if threshold is None:
        return None
    confidence = (
        policy.confidence if policy.confidence is not None else max(guard[1] if guard else 0.0, LIVE_CONFIDENCE)
    )
    return threshold, z_score(confidence)
