"""Lower confidence bounds decide, not point estimates, and the report names the measure."""

from __future__ import annotations

import numpy as np
import pytest

from central.quantize.verdict import Measure, judge, mean_lower_bound, samples_needed, wilson_lower_bound, z_score

Z95 = z_score(0.95)


def test_wilson_bound_values() -> None:
    assert pytest.approx(1.6449, abs=1e-4) == Z95
    assert wilson_lower_bound(13, 13, Z95) == pytest.approx(13 / (13 + Z95**2))  # all agree: n / (n + z²)
    assert wilson_lower_bound(13, 13, Z95) < 0.84  # 13 of 13 proves little
    assert wilson_lower_bound(256, 256, Z95) == pytest.approx(0.98954, abs=1e-5)
    assert wilson_lower_bound(0, 10, Z95) == 0.0 and wilson_lower_bound(0, 0, Z95) == 0.0
    assert wilson_lower_bound(250, 256, Z95) < 250 / 256


def test_samples_needed_is_where_full_agreement_reaches_the_threshold() -> None:
    n = samples_needed(0.97, Z95)
    assert wilson_lower_bound(n, n, Z95) >= 0.97 > wilson_lower_bound(n - 2, n - 2, Z95)


def test_mean_bound() -> None:
    values = np.array([1.0, 0.9, 0.95, 0.97])
    expected = values.mean() - Z95 * values.std(ddof=1) / 2
    assert mean_lower_bound(values, Z95) == pytest.approx(expected)
    assert mean_lower_bound(np.array([0.5]), Z95) == 0.5


def test_point_estimate_above_threshold_still_fails_on_few_samples() -> None:
    few = Measure("top1", 1.0, wilson_lower_bound(13, 13, Z95), 13, "argmax")
    verdict = judge([few], 0.97)
    assert not verdict.passed and verdict.decided_by is few


def test_the_measure_with_the_smallest_margin_decides() -> None:
    top1 = Measure("top1", 1.0, 0.99, 300, "argmax of output 'logits'")
    cosine = Measure("cosine", 0.96, 0.95, 300, "cosine of output 'logits' per sample")
    verdict = judge([top1, cosine], 0.97)
    assert not verdict.passed and verdict.decided_by is cosine
    report = verdict.report()
    assert (report["decided_by"], report["metric"], report["passed"]) == ("cosine", "cosine", False)
    assert report["measures"]["top1"]["lower_bound"] == 0.99 and report["lower_bound"] == 0.95
    assert judge([top1, cosine], 0.9).decided_by is cosine and judge([top1, cosine], 0.9).passed
