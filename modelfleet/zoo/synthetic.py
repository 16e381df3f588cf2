"""A deterministic float32 MLP of any size, built with ``onnx.helper``.

Each layer's weights come from their own seeded generator, so two builds that differ
only in ``head_seed`` share every byte except the last layer's: the shape of a
realistic fine-tune, and what the delta benchmark needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def mlp_bytes(width: int, hidden_layers: int, classes: int = 10) -> int:
    """Approximate size of the weights of ``build_mlp`` (float32)."""
    return 4 * (width * width * hidden_layers + width * hidden_layers + width * classes + classes)


def _layer(rng: np.random.Generator, rows: int, cols: int, index: int) -> tuple[TensorProto, TensorProto]:
    scale = np.float32(1.0 / np.sqrt(rows))
    w = (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)
    b = np.zeros(cols, dtype=np.float32)
    return numpy_helper.from_array(w, f"w{index}"), numpy_helper.from_array(b, f"b{index}")


def build_mlp(
    path: Path,
    *,
    width: int = 256,
    hidden_layers: int = 2,
    classes: int = 10,
    seed: int = 0,
    head_seed: int = 0,
) -> Path:
    """Write an MLP ``[batch, width] → classes`` to ``path`` and return it."""
    nodes, inits = [], []
    current = "input"
    for i in range(hidden_layers + 1):
        last = i == hidden_layers
        rng = np.random.default_rng([seed, head_seed if last else 0, i])
        w, b = _layer(rng, width, classes if last else width, i)
        inits += [w, b]
        mm, added = f"mm{i}", ("logits" if last else f"add{i}")
        nodes.append(helper.make_node("MatMul", [current, w.name], [mm]))
        nodes.append(helper.make_node("Add", [mm, b.name], [added]))
        if not last:
            nodes.append(helper.make_node("Relu", [added], [f"relu{i}"]))
            current = f"relu{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelfleet.zoo")
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
