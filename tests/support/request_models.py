"""Small ONNX models built with ``onnx.helper`` for the tests of bad and slow requests:
a token model whose ``input_ids`` index an embedding (values past its vocabulary make ONNX
Runtime refuse the request) and a MatMul chain whose run time grows with the batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The token model's vocabulary and output classes.
VOCAB = 100
CLASSES = 4


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def build_token_model(path: Path, vocab: int = VOCAB, dim: int = 8, seed: int = 0) -> Path:
    """``input_ids`` and ``attention_mask`` (INT64, [batch, seq]) → ``logits`` (FP32,
    [batch, CLASSES]): the masked sum of the ids' embeddings (Gather over a ``vocab`` ×
    ``dim`` table) times a weight. A mask whose shape differs from the ids' cannot broadcast."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "embedding"),
        numpy_helper.from_array(rng.standard_normal((dim, CLASSES)).astype(np.float32), "head"),
        numpy_helper.from_array(np.array([2], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([1], np.int64), "seq_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"], name="embed"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"], name="mask_unsqueeze"),
        helper.make_node("Mul", ["embedded", "mask_3d"], ["masked"], name="apply_mask"),
        helper.make_node("ReduceSum", ["masked", "seq_axis"], ["pooled"], keepdims=0, name="pool"),
        helper.make_node("MatMul", ["pooled", "head"], ["logits"], name="classify"),
    ]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])
    return _save(helper.make_graph(nodes, "tokens", [ids, mask], [out], inits), path)


def build_matmul_chain(path: Path, width: int = 1024, depth: int = 32, features: int = 64, seed: int = 0) -> Path:
    """``input`` (FP32, [batch, features]) → ``output`` (FP32, [batch, 10]) through ``depth``
    MatMul + Tanh layers of ``width`` that share one weight (a small file, much compute
    per row: about ``2 × depth × width²`` FLOPs)."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(width)
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((features, width)) / np.sqrt(features)).astype(np.float32), "w_in"
        ),
        numpy_helper.from_array((rng.standard_normal((width, width)) * scale).astype(np.float32), "w_hidden"),
        numpy_helper.from_array((rng.standard_normal((width, 10)) * scale).astype(np.float32), "w_out"),
    ]
    nodes = [helper.make_node("MatMul", ["input", "w_in"], ["h0"], name="in")]
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [f"h{i}", "w_hidden"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"], name=f"tanh{i}"))
    nodes.append(helper.make_node("MatMul", [f"h{depth}", "w_out"], ["output"], name="out"))
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])
    return _save(helper.make_graph(nodes, "chain", [x], [y], inits), path)


def token_request(
    ids: Any, mask: Any, ids_shape: list[int] | None = None, mask_shape: list[int] | None = None
) -> dict[str, Any]:
    """An OIP JSON request for the token model (shapes default to the data's)."""
    return {
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": ids_shape or list(np.shape(ids)), "data": ids},
            {"name": "attention_mask", "datatype": "INT64", "shape": mask_shape or list(np.shape(mask)), "data": mask},
        ]
    }


#: Requests the token model refuses: (request, words the 400's error must contain).
BAD_TOKEN_REQUESTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "id past the vocabulary": (token_request([[1, 2, VOCAB]], [[1, 1, 1]]), ["input_ids", str(VOCAB)]),
    "negative id past the vocabulary": (token_request([[1, -VOCAB - 7, 3]], [[1, 1, 1]]), ["input_ids"]),
    "mask shape unlike the ids": (token_request([[1, 2, 3]], [[1, 1, 1, 1, 1]]), ["attention_mask", "[1, 5]"]),
    "mask of the wrong rank": (token_request([[1, 2, 3]], [[[1], [1], [1]]]), ["attention_mask", "rank"]),
    "fractional id": (token_request([[1, 2.5, 3]], [[1, 1, 1]]), ["input_ids", "2.5", "not an integer"]),
    "id beyond INT64": (token_request([[1, 2**63, 3]], [[1, 1, 1]]), ["input_ids", "outside the range of INT64"]),
    "float id beyond INT64": (token_request([[1, 1e20, 3]], [[1, 1, 1]]), ["input_ids", "outside the range of INT64"]),
}


def build_fill_model(path: Path) -> Path:
    """``shape`` (INT64, [2]) → ``filled`` (FP32, a matrix of that shape, all zeros): a
    request for 2**30 × 2**30 asks for 4 EiB, which ONNX Runtime fails to allocate (the
    node's failure, not the data's: what an out-of-memory looks like)."""
    node = helper.make_node("ConstantOfShape", ["shape"], ["filled"], name="fill")
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    filled = helper.make_tensor_value_info("filled", TensorProto.FLOAT, ["rows", "cols"])
    return _save(helper.make_graph([node], "fill", [shape], [filled]), path)
