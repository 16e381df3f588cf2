"""A thin layer over ``onnx.helper`` for the zoo's graph builders.

The zoo builds its architectures from numpy weights with plain ONNX operators, so that
neither the project nor its tests need torch: the node names stay readable (they show up
in quantization reports and in ONNX Runtime's errors) and every builder gets the same
opset, IR version and checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The opset of every zoo graph: LayerNormalization needs 17; ONNX Runtime and the
#: quantization tools in use handle it, and exporters still write it.
OPSET = 17
#: The IR version that goes with opset 17 (newer ONNX writes a higher one by default,
#: which older runtimes on edges refuse).
IR_VERSION = 9
PRODUCER = "modelfleet.zoo"

Dim = int | str


class GraphBuilder:
    """Collects nodes and initializers, and names every intermediate value uniquely."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._used: set[str] = set()

    def _unique(self, hint: str) -> str:
        name, n = hint, 1
        while name in self._used:
            n += 1
            name = f"{hint}_{n}"
        self._used.add(name)
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer called ``name`` (kept as given: names are the weights' keys)."""
        if name in self._used:
            raise ValueError(f"initializer {name!r} added twice")
        self._used.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, hint: str, values: float | Sequence[float] | np.ndarray, dtype: type = np.int64) -> str:
        """A small constant (shapes, axes, scalars) as an initializer."""
        name = self._unique(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str, **attrs: Any) -> str:
        """Add one node with one output and return the output's name."""
        (out,) = self.op_multi(op_type, inputs, hint, 1, **attrs)
        return out

    def op_multi(self, op_type: str, inputs: Sequence[str], hint: str, outputs: int, **attrs: Any) -> list[str]:
        """Add one node with ``outputs`` outputs (named from ``hint``)."""
        names = [self._unique(hint if i == 0 else f"{hint}_out{i}") for i in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), names, name=self._unique(f"{hint}/{op_type}"), **attrs)
        )
        return names

    def model(
        self,
        inputs: Sequence[tuple[str, int, Sequence[Dim]]],
        outputs: Sequence[tuple[str, int, Sequence[Dim]]],
        *,
        rename: dict[str, str] | None = None,
    ) -> onnx.ModelProto:
        """The finished, checked model; ``rename`` maps intermediate names to the graph's output names."""
        for old, new in (rename or {}).items():
            for node in self.nodes:
                node.output[:] = [new if o == old else o for o in node.output]
                node.input[:] = [new if i == old else i for i in node.input]
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
            [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in outputs],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
