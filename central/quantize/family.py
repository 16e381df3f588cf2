"""What kind of model a graph is, and which of its nodes INT8 hurts most.

The family picks the recipes (``central.quantize.recipes``): convolutions want
static per-channel INT8, transformers want their attention fused first and their
MatMuls quantized dynamically (static calibration of attention fails on exported
encoders), plain MLPs take either. Detected from the graph alone, so it works on
whatever an exporter wrote:

* **transformer**: an attention op (``Attention``, ``MultiHeadAttention``), or a
  ``Softmax`` together with a ``MatMul`` of two activations (scores = Q·Kᵀ), or an
  integer input that indexes an embedding table (``Gather`` on an initializer); and
  more MatMul/Gemm than Conv (a ViT's patch embedding is one Conv);
* **cnn**: any ``Conv``/``ConvTranspose``;
* **mlp**: anything else (Gemm/MatMul only; graphs with neither quantize to little).

*Sensitive* nodes are those kept in FP32 on a second try when INT8 of the whole
graph fails the guard: the first and last weighted layers (input and decision
scales differ most from the rest), Softmax and the normalisations, and the
embedding lookups of a transformer."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import onnx

Family = Literal["cnn", "transformer", "mlp"]

_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_ATTENTION_OPS = {"Attention", "MultiHeadAttention", "QAttention", "GroupQueryAttention"}
_SENSITIVE_OPS = {
    "Softmax", "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
    "EmbedLayerNormalization", "InstanceNormalization", "GroupNormalization",
}  # fmt: skip
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


def _initializers(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


def _has_attention(model: onnx.ModelProto, constants: set[str], ops: Counter[str]) -> bool:
    """An attention op, or Softmax plus a MatMul whose inputs are both activations."""
    if _ATTENTION_OPS & set(ops):
        return True
    if not ops["Softmax"]:
        return False
    return any(n.op_type == "MatMul" and not (set(n.input) & constants) for n in model.graph.node)


def embedding_vocab(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph inputs that index an embedding table, and the table's row count.

    A ``Gather`` whose data is an initializer and whose indices are the input (as
    exported token ids, token types and positions are) accepts ids below its first
    dimension only; a later value is an out-of-range error in ONNX Runtime."""
    tables = {init.name: int(init.dims[0]) for init in model.graph.initializer if init.dims}
    int_inputs = {i.name for i in model.graph.input if i.type.tensor_type.elem_type in _INT_TYPES}
    vocab: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in int_inputs:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            rows = tables.get(node.input[0])
            if rows is not None and axis == 0:
                vocab[node.input[1]] = min(rows, vocab.get(node.input[1], rows))
    return vocab


def detect_family(model: onnx.ModelProto) -> Family:
    """``cnn``, ``transformer`` or ``mlp`` (see the module docstring)."""
    ops = Counter(n.op_type for n in model.graph.node)
    convs = ops["Conv"] + ops["ConvTranspose"]
    dense = ops["MatMul"] + ops["Gemm"]
    constants = _initializers(model)
    attention_like = _has_attention(model, constants, ops) or bool(embedding_vocab(model))
    if attention_like and (dense > convs or not convs):
        return "transformer"
    return "cnn" if convs else "mlp"


def _weighted(model: onnx.ModelProto, constants: set[str]) -> list[onnx.NodeProto]:
    """Conv/Gemm/MatMul nodes with a constant weight, in graph (topological) order."""
    return [n for n in model.graph.node if n.op_type in _WEIGHTED and set(n.input[1:2]) & constants]


def sensitive_nodes(model: onnx.ModelProto, family: Family) -> list[str]:
    """Names of the nodes to keep in FP32 on the retry (see the module docstring)."""
    constants = _initializers(model)
    weighted = _weighted(model, constants)
    # Keeping every weighted layer in FP32 would leave nothing worth calling INT8.
    chosen = [weighted[0], weighted[-1]] if len(weighted) > 2 else []
    chosen += [n for n in model.graph.node if n.op_type in _SENSITIVE_OPS]
    if family == "transformer":
        chosen += [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in constants]
    names: list[str] = []
    for node in chosen:
        if node.name and node.name not in names:
            names.append(node.name)
    return names


def name_nodes(model: onnx.ModelProto) -> bool:
    """Give every unnamed node a unique name (exclusions go by name); True if any changed."""
    taken = {n.name for n in model.graph.node if n.name}
    changed = False
    for index, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{index}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)
            changed = True
    return changed
