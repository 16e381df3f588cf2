"""The one input check: tensors that do not fit the model, or share no batch axis, are an
InvalidInputs (400) naming the input, before they could join (and fail) a batch."""

from __future__ import annotations

import numpy as np
import pytest

from edge_node.errors import InvalidInputs
from edge_node.inference.inputs import check_inputs, check_outputs
from fleetwire.manifest import TensorSpec

SPECS = [TensorSpec(name="a", dtype="float64", shape=[-1, 3]), TensorSpec(name="b", dtype="float64", shape=[-1, 3])]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))}, "inputs disagree on the batch dimension: [2, 3]"),
        ({"a": np.zeros((0, 3)), "b": np.zeros((0, 3))}, "the batch is empty (first dimension 0)"),
        ({}, "missing input 'a'"),
        (
            {"a": np.zeros((1, 3)), "b": np.zeros((1, 3)), "c": np.zeros(1)},
            "the model has no input 'c'; its inputs are: a, b",
        ),
        ({"a": np.zeros((1, 3)), "b": np.zeros(3)}, "input 'b' has shape [3] (rank 1); the model expects rank 2"),
        (
            {"a": np.zeros((1, 3)), "b": np.zeros((1, 3), np.int64)},
            "input 'b' has datatype INT64; the model expects FP64",
        ),
    ],
)
def test_inputs_that_do_not_fit_are_refused_naming_why(inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInputs) as refused:
        check_inputs(inputs, SPECS)
    assert message in str(refused.value)


def test_a_scalar_input_has_no_batch_axis() -> None:
    with pytest.raises(InvalidInputs, match="'s' is a scalar"):
        check_inputs({"s": np.float64(1.0)}, [TensorSpec(name="s", dtype="float64", shape=[])])


def test_an_output_the_model_lacks_is_refused() -> None:
    check_outputs(None, SPECS)
    with pytest.raises(InvalidInputs, match="the model has no output 'z'; its outputs are: a, b"):
        check_outputs(["a", "z"], SPECS)
