"""explain_run_error on what a real ONNX Runtime session raises: a request's data (an id
past the vocabulary, shapes that cannot broadcast) is InvalidRequestData naming the input;
a failed allocation, or anything that is not ONNX Runtime refusing the data, is the node's
fault (InferenceFailed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edge_node.errors import InferenceFailed, InvalidRequestData, ModelUnavailable
from edge_node.inference.run_errors import explain_run_error
from support.request_models import VOCAB, build_token_model

Feed = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = build_token_model(tmp_path_factory.mktemp("m") / "tokens.onnx")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _raised(session: ort.InferenceSession, feed: Feed) -> Exception:
    with pytest.raises(Exception) as caught:
        session.run(None, feed)
    assert isinstance(caught.value, Exception)
    return caught.value


def _feed(ids: list[list[int]], mask: list[list[int]]) -> Feed:
    return {"input_ids": np.array(ids, dtype=np.int64), "attention_mask": np.array(mask, dtype=np.int64)}


def test_an_id_past_the_vocabulary_names_the_input_and_the_value(tokens: ort.InferenceSession) -> None:
    feed = _feed([[4, VOCAB + 3, 1]], [[1, 1, 1]])
    error = explain_run_error(_raised(tokens, feed), feed)
    assert isinstance(error, InvalidRequestData)
    message = str(error)
    assert message.startswith(f"input 'input_ids' holds {VOCAB + 3}, a value the model cannot take at node 'embed'")
    assert f"[-{VOCAB},{VOCAB - 1}]" in message and "[ONNXRuntimeError]" not in message


def test_shapes_that_cannot_broadcast_list_the_inputs_shapes(tokens: ort.InferenceSession) -> None:
    feed = _feed([[1, 2, 3]], [[1, 1, 1, 1]])
    error = explain_run_error(_raised(tokens, feed), feed)
    assert isinstance(error, InvalidRequestData)
    message = str(error)
    assert "node 'apply_mask' (Mul)" in message and "'input_ids' [1, 3], 'attention_mask' [1, 4]" in message
    assert "onnxruntime_src" not in message  # the C++ source location is left out


def test_a_failed_allocation_is_the_nodes_fault(tmp_path: Path) -> None:
    """A fill of 2**60 floats: no machine has the memory, ORT's arena refuses at once."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["out"], name="fill")],
        "fill",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"shape": np.array([2**30, 2**30], dtype=np.int64)}
    error = explain_run_error(_raised(session, feed), feed)
    assert isinstance(error, InferenceFailed) and "Failed to allocate memory" in str(error), error


def test_errors_that_are_not_onnx_runtime_refusing_the_data() -> None:
    feed = _feed([[1]], [[1]])
    assert isinstance(explain_run_error(RuntimeError("CUDA failure 700: illegal address"), feed), InferenceFailed)
    assert isinstance(explain_run_error(MemoryError(), feed), InferenceFailed)
    assert isinstance(explain_run_error(KeyError("logits"), feed), InferenceFailed)
    unavailable = ModelUnavailable("m was released")
    assert explain_run_error(unavailable, feed) is unavailable
    missing = explain_run_error(ValueError("Required inputs (['attention_mask']) are missing"), feed)
    assert isinstance(missing, InvalidRequestData) and "attention_mask" in str(missing)
