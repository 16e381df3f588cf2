"""Artifacts of one model whose speeds differ by 10x and more, built with ``onnx.helper``.

All three take ``input`` [batch, 256] float32 and give ``logits`` [batch, 10], as a
version's FP32 and INT8 artifacts do. What they compute differs (the chooser compares
speed; the accuracy guard is central's business):

- ``fp32``: 256 -> 1024 -> 1024 -> 10, about 1.3 M multiply-adds per row;
- ``fast``: 256 -> 16 -> 10, about 300 times less work;
- ``slow``: ``fp32`` plus a chain of forty useless 1024x1024 MatMuls whose sum is added
  times zero (ONNX Runtime cannot fold that away: the zero multiplies a computed tensor),
  about thirty times the work of ``fp32`` for one more weight matrix (shared by the chain)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IN, OUT, HIDDEN, SLOW_CHAIN = 256, 10, 1024, 40


def _weight(name: str, rows: int, cols: int, rng: np.random.Generator) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32), name)


def _save(nodes: list[onnx.NodeProto], weights: list[onnx.TensorProto], path: Path) -> Path:
    graph = helper.make_graph(
        nodes,
        "artifact",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", OUT])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _mlp(widths: list[int], rng: np.random.Generator) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    nodes, weights, x = [], [], "input"
    for i, (rows, cols) in enumerate(itertools.pairwise(widths)):
        weights.append(_weight(f"w{i}", rows, cols, rng))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
        if i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    return nodes, weights, x


def build_fp32(path: Path, seed: int = 0) -> Path:
    """The baseline."""
    nodes, weights, out = _mlp([IN, HIDDEN, HIDDEN, OUT], np.random.default_rng(seed))
    nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return _save(nodes, weights, path)


def build_fast(path: Path, seed: int = 1) -> Path:
    """About a hundredth of the baseline's work."""
    nodes, weights, out = _mlp([IN, 16, OUT], np.random.default_rng(seed))
    nodes.append(helper.make_node("Identity", [out], ["logits"]))
    return _save(nodes, weights, path)


def build_slow(path: Path, seed: int = 0) -> Path:
    """The baseline plus about thirty times its work, which does not change the result."""
    rng = np.random.default_rng(seed)
    nodes, weights, out = _mlp([IN, HIDDEN, HIDDEN, OUT], rng)
    weights.append(_weight("square", HIDDEN, HIDDEN, rng))
    x = "r0"  # the first hidden layer's activations, [batch, HIDDEN]
    for i in range(SLOW_CHAIN):
        nodes.append(helper.make_node("MatMul", [x, "square"], [f"c{i}"]))
        nodes.append(helper.make_node("Tanh", [f"c{i}"], [f"t{i}"]))  # bounded: 0 * value stays 0
        x = f"t{i}"
    weights.append(numpy_helper.from_array(np.zeros((1,), np.float32), "zero"))
    nodes += [
        helper.make_node("ReduceSum", [x], ["waste"], keepdims=1),
        helper.make_node("Mul", ["waste", "zero"], ["nothing"]),
        helper.make_node("Add", [out, "nothing"], ["logits"]),
    ]
    return _save(nodes, weights, path)
