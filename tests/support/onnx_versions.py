"""Small models at chosen IR versions and opsets, built with ``onnx.helper`` for the
opset and IR-version tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 8
CLASSES = 4


def dense_model(opset: int, ir_version: int | None = None, *, seed: int = 0) -> onnx.ModelProto:
    """MatMul, Add, LayerNormalization (opset 17+), Relu and Softmax: ``input [n, 8]`` →
    ``probabilities [n, 4]``. ``ir_version`` None keeps what ``make_model`` stamps (the
    installed onnx's newest), as exporters do."""
    rng = np.random.default_rng(seed)
    weights = [
        numpy_helper.from_array(rng.standard_normal((WIDTH, CLASSES)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(CLASSES).astype(np.float32), "b"),
        numpy_helper.from_array(np.ones(CLASSES, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "scale", "b"], ["n"], axis=-1),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Softmax", ["r"], ["probabilities"], axis=-1),
    ]
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", CLASSES])
    graph = helper.make_graph(nodes, "dense", [x], [y], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    if ir_version is not None:
        model.ir_version = ir_version
    onnx.checker.check_model(model)
    return model


def swiglu_model(opset: int) -> onnx.ModelProto:
    """One SwiGLU (an operator new in opset 28, with no older version to convert to)."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, WIDTH])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, WIDTH])
    node = helper.make_node("SwiGLU", ["input", "input"], ["output"])
    graph = helper.make_graph([node], "swiglu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def gelu_model(opset: int) -> onnx.ModelProto:
    """``input [n, 8]`` → Gelu → ``output``: Gelu is new in opset 20, with no older version to
    convert to, so ONNX's version converter cannot bring this model below opset 20."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph([helper.make_node("Gelu", ["input"], ["output"])], "gelu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    onnx.checker.check_model(model)
    return model


def with_initializer_type(model: onnx.ModelProto, data_type: int) -> onnx.ModelProto:
    """``model`` plus an unused one-element initializer ``extra`` of ``data_type`` (one byte
    holds one element of every type of 8 bits or less; the checker accepts it)."""
    model.graph.initializer.append(TensorProto(name="extra", data_type=data_type, dims=[1], raw_data=b"\x01"))
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path
