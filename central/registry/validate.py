"""ONNX validation and signature extraction for pushed files."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from central.errors import BadRequest
from fleetwire.manifest import TensorSpec


def load_checked(path: Path) -> onnx.ModelProto:
    """Parse and check an uploaded model; any failure is the uploader's (400)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, and others on garbage
        raise BadRequest(f"not an ONNX model: {type(exc).__name__}: {exc}") from exc
    if not model.HasField("graph") or not model.opset_import:
        raise BadRequest("not an ONNX model: no graph or no opset import")
    if _uses_external_data(model):
        raise BadRequest("models with external data files are not supported; embed the weights")
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise BadRequest(f"ONNX checker rejected the model: {exc}") from exc
    return model


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except Exception:
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def signature(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's real inputs (initializers excluded) and outputs."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [_spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_spec(v) for v in model.graph.output]
    return inputs, outputs
