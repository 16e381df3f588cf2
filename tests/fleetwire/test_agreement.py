"""fleetwire.agreement: the per-sample measures the guard and the edge's shadow share."""

from __future__ import annotations

import numpy as np
import pytest

from fleetwire.agreement import per_sample, relative_error, relative_errors
from fleetwire.manifest import TensorSpec

SCORES = [TensorSpec(name="logits", dtype="float32", shape=[-1, 3])]
REGRESSION = [TensorSpec(name="y", dtype="float32", shape=[-1, 1])]


def test_a_classifier_is_compared_by_top1_and_cosine_per_sample() -> None:
    ref = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]], dtype=np.float32)
    got = np.array([[3.0, 1.0, 0.0], [0.0, 1.0, 2.0]], dtype=np.float32)  # the second row flips
    agreement = per_sample(SCORES, [ref], [got])
    assert agreement.measure == "cosine"
    assert agreement.top1 is not None and agreement.top1.tolist() == [True, False]
    assert agreement.values[0] == pytest.approx(1.0) and 0.0 < agreement.values[1] < 1.0


def test_a_label_output_decides_top1() -> None:
    outputs = [TensorSpec(name="label", dtype="int64", shape=[-1]), *SCORES]
    probs = np.array([[0.9, 0.1, 0.0]], dtype=np.float32)
    agreement = per_sample(outputs, [np.array([0]), probs], [np.array([2]), probs])
    assert agreement.top1 is not None and agreement.top1.tolist() == [False]
    assert agreement.measure == "cosine" and agreement.values.tolist() == pytest.approx([1.0])


def test_other_models_get_one_minus_the_relative_error_of_each_row() -> None:
    ref = np.array([[1.0], [2.0], [0.0]])
    got = np.array([[1.0], [1.0], [0.0]])
    agreement = per_sample(REGRESSION, [ref], [got])
    assert agreement.top1 is None and agreement.measure == "relative_error"
    assert agreement.values.tolist() == [1.0, 0.5, 1.0]
    # A batch's own error is the rows' together, as the guard computes it.
    assert relative_errors(REGRESSION, [ref[:2]], [got[:2]]).tolist() == [0.0, 0.5]
    assert relative_error(REGRESSION, [ref], [got])[0] == np.sqrt(1 / 5)


def test_an_error_beyond_one_floors_at_zero() -> None:
    agreement = per_sample(REGRESSION, [np.array([[1.0]])], [np.array([[-2.0]])])
    assert agreement.values.tolist() == [0.0]
