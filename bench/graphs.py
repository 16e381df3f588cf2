"""A ResNet-style CNN and a BERT-style encoder classifier, built with ``onnx.helper``.

Random, seeded weights: what these graphs are for is the *shape* of real
architectures (conv/BatchNorm/ReLU/residual/pooling; token embeddings, attention
with an INT64 mask, LayerNorm, GELU, dynamic batch and sequence axes), so that the
quantization recipes, the guard and the INT8 benchmark run on what exporters write
without torch or a download. The encoder follows the pattern PyTorch exports of
BERT have (``Reshape``/``Transpose`` heads, ``(1 - mask) * -10000`` added to the
scores, erf GELU), which ONNX Runtime's transformer optimizer knows how to fuse.
Trained models for the zoo are made elsewhere; these are for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Graph:
    """Nodes and initializers being collected, with fresh names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def weight(self, shape: tuple[int, ...], fan_in: int, prefix: str = "w") -> str:
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        return self.const(w, prefix)


def _save(
    g: _Graph, graph_name: str, inputs: list[onnx.ValueInfoProto], output: onnx.ValueInfoProto, path: Path
) -> Path:
    graph = helper.make_graph(g.nodes, graph_name, inputs, [output], initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bench.graphs")
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# --- CNN ---------------------------------------------------------------------------


def _conv_bn(g: _Graph, x: str, cin: int, cout: int, kernel: int, stride: int, relu: bool) -> str:
    w = g.weight((cout, cin, kernel, kernel), cin * kernel * kernel)
    pad = kernel // 2
    y = g.op("Conv", [x, w], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)
    scale = g.const((1.0 + 0.1 * g.rng.standard_normal(cout)).astype(np.float32), "bn_scale")
    bias = g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32), "bn_bias")
    mean = g.const((0.05 * g.rng.standard_normal(cout)).astype(np.float32), "bn_mean")
    var = g.const((1.0 + 0.1 * g.rng.random(cout)).astype(np.float32), "bn_var")
    y = g.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return g.op("Relu", [y]) if relu else y


def _basic_block(g: _Graph, x: str, cin: int, cout: int, stride: int) -> str:
    y = _conv_bn(g, x, cin, cout, 3, stride, relu=True)
    y = _conv_bn(g, y, cout, cout, 3, 1, relu=False)
    skip = x if stride == 1 and cin == cout else _conv_bn(g, x, cin, cout, 1, stride, relu=False)
    return g.op("Relu", [g.op("Add", [y, skip])])


def build_cnn(
    path: Path,
    *,
    image: int = 32,
    widths: tuple[int, ...] = (8, 16),
    blocks: int = 1,
    classes: int = 10,
    seed: int = 0,
    normalize: bool = False,
) -> Path:
    """A ResNet-style classifier ``[batch, 3, image, image] → [batch, classes]``.

    ``widths=(64, 128, 256, 512), blocks=2`` is ResNet-18's body. ``normalize`` puts
    ImageNet's ``(x - mean) / std`` in front, as many exported vision models have."""
    g = _Graph(seed)
    x = "image"
    if normalize:
        mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
        std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
        x = g.op("Div", [g.op("Sub", [x, g.const(mean, "mean")]), g.const(std, "std")])
    y = _conv_bn(g, x, 3, widths[0], 3, 1, relu=True)
    cin = widths[0]
    for stage, width in enumerate(widths):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = _basic_block(g, y, cin, width, stride)
            cin = width
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])])
    head = [y, g.weight((classes, cin), cin), g.const(np.zeros(classes, np.float32), "b")]
    g.op("Gemm", head, out="logits", transB=1)
    spec = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, image, image])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])
    return _save(g, "resnet_like", [spec], out, path)


# --- transformer -----------------------------------------------------------------------


def _linear(g: _Graph, x: str, rows: int, cols: int, out: str | None = None) -> str:
    w = g.const((g.rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32), "w")
    b = g.const((g.rng.standard_normal(cols) * 0.02).astype(np.float32), "b")
    return g.op("Add", [g.op("MatMul", [x, w]), b], out=out)


def _layer_norm(g: _Graph, x: str, hidden: int) -> str:
    gamma = g.const((1.0 + 0.05 * g.rng.standard_normal(hidden)).astype(np.float32), "gamma")
    beta = g.const((0.05 * g.rng.standard_normal(hidden)).astype(np.float32), "beta")
    return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-12)


def _heads(g: _Graph, x: str, heads: int, head_dim: int, perm: list[int]) -> str:
    shape = g.const(np.array([0, 0, heads, head_dim], np.int64), "shape")
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=perm)


def _attention(g: _Graph, x: str, mask_bias: str, hidden: int, heads: int) -> str:
    d = hidden // heads
    q = _heads(g, _linear(g, x, hidden, hidden), heads, d, [0, 2, 1, 3])
    k = _heads(g, _linear(g, x, hidden, hidden), heads, d, [0, 2, 3, 1])
    v = _heads(g, _linear(g, x, hidden, hidden), heads, d, [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.const(np.array(np.sqrt(d), np.float32), "sqrt_d")])
    probs = g.op("Softmax", [g.op("Add", [scores, mask_bias])], axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [context, g.const(np.array([0, 0, hidden], np.int64), "shape")])
    return _layer_norm(g, g.op("Add", [_linear(g, merged, hidden, hidden), x]), hidden)


def _gelu(g: _Graph, x: str) -> str:
    erf = g.op("Erf", [g.op("Div", [x, g.const(np.array(np.sqrt(2.0), np.float32), "sqrt2")])])
    y = g.op("Mul", [x, g.op("Add", [erf, g.const(np.array(1.0, np.float32), "one")])])
    return g.op("Mul", [y, g.const(np.array(0.5, np.float32), "half")])


def _mask_bias(g: _Graph) -> str:
    """``(1 - mask[:, None, None, :]) * -10000``: 0 where attended, very negative elsewhere."""
    m = g.op("Unsqueeze", ["attention_mask", g.const(np.array([1], np.int64), "axes")])
    m = g.op("Unsqueeze", [m, g.const(np.array([2], np.int64), "axes")])
    m = g.op("Cast", [m], to=TensorProto.FLOAT)
    m = g.op("Sub", [g.const(np.array(1.0, np.float32), "one"), m])
    return g.op("Mul", [m, g.const(np.array(-10000.0, np.float32), "neg")])


def build_transformer(
    path: Path,
    *,
    vocab: int = 100,
    hidden: int = 32,
    heads: int = 2,
    layers: int = 1,
    intermediate: int | None = None,
    max_positions: int = 512,
    classes: int = 4,
    seed: int = 0,
) -> Path:
    """A BERT-style classifier: ``input_ids``/``attention_mask`` ``[batch, seq]`` (INT64)
    → ``logits [batch, classes]`` from the first token, both axes dynamic."""
    g = _Graph(seed)
    words = g.const((g.rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32), "word_embeddings")
    positions = g.const((g.rng.standard_normal((max_positions, hidden)) * 0.1).astype(np.float32), "pos_embeddings")
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(np.array(1, np.int64), "one")], axis=0)
    pos_ids = g.op("Range", [g.const(np.array(0, np.int64), "zero"), seq, g.const(np.array(1, np.int64), "step")])
    embedded = g.op("Add", [g.op("Gather", [words, "input_ids"]), g.op("Gather", [positions, pos_ids])])
    x = _layer_norm(g, embedded, hidden)
    bias = _mask_bias(g)
    for _ in range(layers):
        x = _attention(g, x, bias, hidden, heads)
        ffn = _linear(
            g, _gelu(g, _linear(g, x, hidden, intermediate or 4 * hidden)), intermediate or 4 * hidden, hidden
        )
        x = _layer_norm(g, g.op("Add", [ffn, x]), hidden)
    first = g.op("Gather", [x, g.const(np.array(0, np.int64), "cls")], axis=1)
    pooled = g.op("Tanh", [_linear(g, first, hidden, hidden)])
    _linear(g, pooled, hidden, classes, out="logits")
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])
    return _save(g, "bert_like", [ids, mask], out, path)
