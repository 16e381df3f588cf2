"""Model families and sensitive nodes, detected from graphs built the way exporters write them."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from quant_models import bert, cnn, digits_model

from central.quantize.family import detect_family, embedding_vocab, name_nodes, sensitive_nodes
from modelfleet.zoo import build_mlp
from modelfleet.zoo.digits import DigitsModel


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    return digits_model(tmp_path_factory)


def _load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


def test_cnn_transformer_and_mlp_are_told_apart(tmp_path: Path, digits: DigitsModel) -> None:
    assert detect_family(_load(cnn(tmp_path / "cnn.onnx"))) == "cnn"
    assert detect_family(_load(bert(tmp_path / "bert.onnx"))) == "transformer"
    assert detect_family(_load(build_mlp(tmp_path / "mlp.onnx", width=16, hidden_layers=1))) == "mlp"
    # skl2onnx's MLP ends in Softmax, but no MatMul multiplies two activations: not attention.
    assert detect_family(_load(digits.onnx_path)) == "mlp"


def test_embedding_vocab_is_the_table_an_id_input_indexes(tmp_path: Path) -> None:
    model = _load(bert(tmp_path / "bert.onnx", vocab=321))
    assert embedding_vocab(model) == {"input_ids": 321}


def test_sensitive_nodes_are_first_and_last_layers_softmax_and_norms(tmp_path: Path) -> None:
    resnet = _load(cnn(tmp_path / "cnn.onnx"))
    chosen = sensitive_nodes(resnet, "cnn")
    by_name = {n.name: n.op_type for n in resnet.graph.node}
    assert [by_name[n] for n in chosen] == ["Conv", "Gemm"]
    assert chosen[0] == next(n.name for n in resnet.graph.node if n.op_type == "Conv")
    encoder = _load(bert(tmp_path / "bert.onnx", layers=2))
    ops = [{n.name: n.op_type for n in encoder.graph.node}[name] for name in sensitive_nodes(encoder, "transformer")]
    # The one Gather on a table is the word embedding (positions are a Slice of theirs).
    assert ops.count("Softmax") == 2 and ops.count("LayerNormalization") == 5 and ops.count("Gather") == 1
    assert ops[:2] == ["MatMul", "MatMul"]  # the first projection and the classifier


@pytest.mark.parametrize("names", [["", ""], ["Relu_1", ""]])
def test_unnamed_nodes_get_unique_names(names: list[str]) -> None:
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Relu", ["x"], ["y"], name=names[0]),
            onnx.helper.make_node("Relu", ["y"], ["z"], name=names[1]),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(graph)
    assert name_nodes(model) is True
    assert len({n.name for n in model.graph.node}) == 2 and all(n.name for n in model.graph.node)
    assert name_nodes(model) is False
