"""What a decoder graph shows of itself: its KV-cache inputs and outputs, logits, shapes.

A language model exported for inference with a KV cache (ONNX Runtime GenAI's builder,
Optimum) takes the cache of the tokens seen so far as ``past_key_values.<i>.key`` /
``.value`` inputs and returns the grown cache as ``present.<i>.key`` / ``.value``
outputs, one pair per layer; its cache tensors are ``[batch, kv_heads, length, head_size]``
and its ``logits`` ``[batch, sequence, vocab]``. Read from the graph alone (no weights)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import onnx

#: ``past_key_values.3.key``: the conventional past names (GenAI builder, Optimum).
PAST_NAME = re.compile(r"past_key_values\.(\d+)\.(key|value)")
#: ``present.3.key``: the conventional present names.
PRESENT_NAME = re.compile(r"present\.(\d+)\.(key|value)")


@dataclass(frozen=True)
class GraphTensor:
    """One graph input or output: element type (ONNX enum) and shape (None: symbolic)."""

    name: str
    elem_type: int
    shape: tuple[int | None, ...]


@dataclass
class DecoderGraph:
    """The inputs and outputs of a graph, by name."""

    inputs: dict[str, GraphTensor] = field(default_factory=dict)
    outputs: dict[str, GraphTensor] = field(default_factory=dict)

    def kv_layers(self, pattern: re.Pattern[str], names: dict[str, GraphTensor]) -> dict[int, set[str]]:
        """Layer index → which of key/value the graph has under ``pattern``."""
        layers: dict[int, set[str]] = {}
        for name in names:
            match = pattern.fullmatch(name)
            if match:
                layers.setdefault(int(match.group(1)), set()).add(match.group(2))
        return layers

    @property
    def past_layers(self) -> dict[int, set[str]]:
        """Layers with conventional past inputs."""
        return self.kv_layers(PAST_NAME, self.inputs)

    @property
    def present_layers(self) -> dict[int, set[str]]:
        """Layers with conventional present outputs."""
        return self.kv_layers(PRESENT_NAME, self.outputs)

    @property
    def looks_like_decoder(self) -> bool:
        """KV-cache inputs and outputs by the conventional names."""
        return bool(self.past_layers) and bool(self.present_layers)


def _tensor(value: onnx.ValueInfoProto) -> GraphTensor:
    tensor = value.type.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return GraphTensor(value.name, tensor.elem_type, shape)


def read_graph(model: onnx.ModelProto) -> DecoderGraph:
    """The graph's real inputs (initializers excluded) and outputs."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: _tensor(v) for v in model.graph.input if v.name not in initializers}
    outputs = {v.name: _tensor(v) for v in model.graph.output}
    return DecoderGraph(inputs, outputs)
