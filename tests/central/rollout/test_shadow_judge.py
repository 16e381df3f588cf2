"""The live INT8 judge: upper bounds against known values, nothing flagged on a handful of
samples, a large drop flagged within 20, high agreement never, pooling, and reading the
guard's threshold from an artifact's report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from central.quantize.verdict import wilson_lower_bound, z_score
from central.rollout.shadow_judge import (
    LIVE_CONFIDENCE,
    MIN_LIVE_SAMPLES,
    ShadowPolicy,
    guard_threshold,
    judge_fleet,
    judge_node,
    judging_terms,
    mean_upper_bound,
    samples_to_flag,
    token_logprob,
    wilson_upper_bound,
)
from fleetwire.mqtt.payloads import ShadowInfo

Z95 = z_score(0.95)


def classifier(agree: int, n: int, cosines: list[float] | None = None) -> ShadowInfo:
    """A classifier's report: top-1 counts and the cosine sums of ``cosines`` (n of 1.0 by default)."""
    values = np.asarray(cosines if cosines is not None else [1.0] * n)
    return ShadowInfo(
        samples=n, top1_agree=agree, top1_samples=n, measure="cosine",
        measure_sum=float(values.sum()), measure_sumsq=float((values**2).sum()),
    )  # fmt: skip


def regressor(values: list[float]) -> ShadowInfo:
    v = np.asarray(values)
    return ShadowInfo(
        samples=v.size, measure="relative_error", measure_sum=float(v.sum()), measure_sumsq=float((v**2).sum())
    )


def test_wilson_upper_bound_known_values() -> None:
    # The two-sided 95 % Wilson interval of 5/10 is (0.2366, 0.7634); of 0/10, (0, 0.2775).
    assert wilson_upper_bound(5, 10, 1.959964) == pytest.approx(0.7634, abs=1e-4)
    assert wilson_upper_bound(0, 10, 1.959964) == pytest.approx(0.2775, abs=1e-4)
    assert wilson_upper_bound(10, 10, Z95) == 1.0 and wilson_upper_bound(0, 0, Z95) == 1.0
    # The mirror of the guard's lower bound.
    for k, n in [(0, 1), (3, 7), (13, 21), (199, 200), (999, 1000)]:
        assert wilson_upper_bound(k, n, Z95) == pytest.approx(1 - wilson_lower_bound(n - k, n, Z95), abs=1e-12)


def test_mean_upper_bound_matches_the_sample_statistics() -> None:
    values = np.array([0.91, 0.97, 0.88, 0.99, 0.95, 0.93])
    expected = values.mean() + Z95 * values.std(ddof=1) / math.sqrt(values.size)
    total, total_sq = float(values.sum()), float((values**2).sum())
    assert mean_upper_bound(total, total_sq, values.size, Z95) == pytest.approx(expected, rel=1e-9)
    assert mean_upper_bound(0.5, 0.25, 1, Z95) == math.inf  # one value has no spread
    # Rounding that would make the variance a hair negative reads as no spread.
    assert mean_upper_bound(0.3 * 3, 0.09 * 3 - 1e-15, 3, Z95) == pytest.approx(0.3)


def test_nothing_is_flagged_on_a_handful_of_samples() -> None:
    few = MIN_LIVE_SAMPLES - 1
    verdict = judge_node(classifier(0, few, [0.0] * few), 0.99, Z95)
    assert not verdict.flagged and verdict.measure is None
    assert verdict.reason == f"{few} live samples; at least {MIN_LIVE_SAMPLES} needed before agreement is judged"
    assert samples_to_flag(0.99, Z95) == MIN_LIVE_SAMPLES


@pytest.mark.parametrize("confidence", [0.95, LIVE_CONFIDENCE])
def test_a_large_drop_is_flagged_within_twenty_samples(confidence: float) -> None:
    z = z_score(confidence)
    needed = samples_to_flag(0.99, z, agreement=0.5)
    assert needed is not None and needed <= 20
    rng = np.random.default_rng(16)
    for _ in range(50):  # agreement about 0.5, as 20 live samples would show it
        agree = int(rng.binomial(20, 0.5))
        verdict = judge_node(classifier(agree, 20, list(rng.uniform(0.6, 0.99, 20))), 0.99, z)
        assert verdict.flagged and verdict.bound is not None and verdict.bound < 0.99


def test_reason_names_the_measure_and_figures() -> None:
    verdict = judge_node(classifier(13, 21), 0.99, Z95)
    assert verdict.flagged and verdict.measure == "top1" and verdict.samples == 21
    assert verdict.value == pytest.approx(13 / 21)
    assert verdict.reason == "top-1 agreement 0.619 (upper bound 0.7701 at 95 %) on 21 live samples < threshold 0.99"
    assert verdict.as_dict()["flagged"] is True


def test_high_agreement_is_not_flagged() -> None:
    rng = np.random.default_rng(7)
    cosines = list(rng.uniform(0.995, 1.0, 500))
    verdict = judge_node(classifier(498, 500, cosines), 0.99, Z95)
    assert not verdict.flagged and "not below threshold 0.99" in verdict.reason
    # Agreement just below the threshold on few samples is not confidently below it.
    assert not judge_node(classifier(29, 30), 0.97, Z95).flagged
    assert samples_to_flag(0.99, Z95, agreement=0.995) is None


def test_continuous_measure_flags_a_regressor() -> None:
    rng = np.random.default_rng(3)
    fine = regressor(list(rng.uniform(0.985, 1.0, 40)))
    drifted = regressor(list(rng.uniform(0.90, 0.96, 40)))
    assert not judge_node(fine, 0.98, Z95).flagged
    verdict = judge_node(drifted, 0.98, Z95)
    assert verdict.flagged and verdict.measure == "relative_error"
    assert verdict.reason.startswith("1 - relative L2 0.9")


def test_fleet_pools_nodes_too_small_to_judge_alone() -> None:
    nodes = [classifier(2, 5), classifier(3, 5), classifier(2, 5), classifier(3, 5)]
    assert not any(judge_node(n, 0.99, Z95).flagged for n in nodes)
    fleet = judge_fleet(nodes, 0.99, Z95)
    assert fleet.flagged and fleet.samples == 20 and fleet.value == pytest.approx(0.5)
    healthy = judge_fleet([classifier(100, 100)] * 4, 0.99, Z95)
    assert not healthy.flagged and healthy.samples == 400
    # The continuous measure pools too (over the nodes reporting the same one).
    drifted = [regressor([0.90, 0.92, 0.91, 0.93, 0.90]) for _ in range(4)]
    odd = ShadowInfo(samples=50, measure="cosine", measure_sum=50.0, measure_sumsq=50.0)
    assert not judge_node(drifted[0], 0.98, Z95).flagged
    pooled = judge_fleet([*drifted, odd], 0.98, Z95)
    assert pooled.flagged and pooled.measure == "relative_error" and pooled.samples == 20


def test_guard_threshold_from_artifact_and_push_reports() -> None:
    artifact = {"recipe": "int8-u8s8-qdq", "guard": {"passed": True, "threshold": 0.97, "confidence": 0.95}}
    push = {"served": "int8-u8s8-qdq", "threshold": 0.99, "confidence": 0.9, "candidates": {}}
    assert guard_threshold(artifact) == (0.97, 0.95)
    assert guard_threshold(push) == (0.99, 0.9)
    assert guard_threshold(None) is None and guard_threshold({}) is None
    assert guard_threshold({"recipe": "x", "guard": {"threshold": "0.9", "confidence": 0.95}}) is None
    # Live samples are judged at the guard's confidence or 99.9 %, whichever is higher.
    assert judging_terms(ShadowPolicy(), artifact) == (0.97, pytest.approx(z_score(LIVE_CONFIDENCE)))
    assert judging_terms(ShadowPolicy(confidence=0.9), artifact) == (0.97, pytest.approx(z_score(0.9)))
    assert judging_terms(ShadowPolicy(), None) is None
    assert judging_terms(ShadowPolicy(threshold=0.95), None) == (0.95, pytest.approx(z_score(LIVE_CONFIDENCE)))


def decoder(agree: int, greedy: int, nll: list[float]) -> ShadowInfo:
    """A language model's report: greedy agreement per served token, and the served tokens' NLL."""
    v = np.asarray(nll)
    return ShadowInfo(
        samples=v.size, top1_agree=agree, top1_samples=greedy, measure="token_nll",
        measure_sum=float(v.sum()), measure_sumsq=float((v**2).sum()),
    )  # fmt: skip


def test_a_language_model_is_judged_on_greedy_agreement_against_its_text_guard() -> None:
    int4 = {"recipe": "int4-b32", "family": "decoder",
            "text_guard": {"greedy_agreement": {"min": 0.9, "lower_bound": 0.95}, "confidence": 0.95}}  # fmt: skip
    assert guard_threshold(int4) == (0.9, 0.95)
    push = {"family": "decoder", "thresholds": {"max_perplexity_ratio": 1.1, "min_greedy_agreement": 0.8},
            "confidence": 0.95, "served": "int4-b32"}  # fmt: skip
    assert guard_threshold(push) == (0.8, 0.95)  # the default artifact's report is the push's
    threshold, z = judging_terms(ShadowPolicy(), int4) or (0.0, 0.0)
    bad = judge_node(decoder(40, 60, [2.0] * 80), threshold, z)
    assert bad.flagged and bad.measure == "top1" and bad.samples == 60
    assert bad.reason.startswith("greedy agreement 0.6667 (upper bound") and "60 served greedy tokens" in bad.reason
    good = judge_node(decoder(59, 60, [0.5] * 60), threshold, z)
    assert not good.flagged
    # The served tokens' log-probability is reported, never judged: sampled traffic alone flags nothing.
    assert not judge_node(decoder(0, 0, [9.0] * 500), threshold, z).flagged
    figures = token_logprob(decoder(0, 0, [1.0, 3.0]), Z95)
    assert figures is not None and figures["mean"] == -2.0 and figures["tokens"] == 2
    assert figures["lower_bound"] < -2.0 and figures["perplexity"] == pytest.approx(math.exp(2.0), rel=1e-4)
    assert token_logprob(classifier(5, 5), Z95) is None
