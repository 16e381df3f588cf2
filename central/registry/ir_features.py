"""The oldest ONNX IR version a model's content needs.

Exporters stamp a model with the IR version of the ``onnx`` package that wrote it, not with
the oldest one its content needs: ``onnx.helper.make_model`` under onnx 1.23 writes IR 14
into a plain float32 MLP that IR 7 describes. Rewriting ``ir_version`` down is safe exactly
when nothing in the model came with a later IR version: its opsets (``onnx.helper``'s
table), its data types (the 8-, 4- and 2-bit and 6-bit float types each came with one) and a
few proto features. What each IR version added is listed in ``onnx.proto``'s ``Version``
enum; a data type this table does not know needs an IR version nobody loads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

#: Data types that came after IR 7, by the IR version that added them (``onnx.proto``).
_TYPE_IR = {
    TensorProto.FLOAT8E4M3FN: 9,
    TensorProto.FLOAT8E4M3FNUZ: 9,
    TensorProto.FLOAT8E5M2: 9,
    TensorProto.FLOAT8E5M2FNUZ: 9,
    TensorProto.UINT4: 10,
    TensorProto.INT4: 10,
    23: 11,  # FLOAT4E2M1
    24: 12,  # FLOAT8E8M0
    25: 13,  # UINT2
    26: 13,  # INT2
    27: 14,  # FLOAT6E2M3
    28: 14,  # FLOAT6E3M2
}
#: The newest data type ``_TYPE_IR`` knows; any later one needs an IR version past every table here.
_KNOWN_TYPES = 28
UNKNOWN_IR = 1 << 30
#: Integer attributes that name a data type (Cast's ``to``, QuantizeLinear's ``output_dtype``, ...).
_TYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype"})


@dataclass(frozen=True)
class Need:
    """An IR version the model needs, and what in the model needs it."""

    ir_version: int
    why: str


def _type_name(elem_type: int) -> str:
    try:
        return str(TensorProto.DataType.Name(elem_type))
    except ValueError:
        return f"data type {elem_type}"


def _type_ir(elem_type: int) -> int:
    if elem_type > _KNOWN_TYPES:
        return UNKNOWN_IR
    return _TYPE_IR.get(elem_type, 3)


def _type_needs(tp: onnx.TypeProto, where: str) -> Iterator[Need]:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        yield Need(_type_ir(tp.tensor_type.elem_type), f"{where}: {_type_name(tp.tensor_type.elem_type)}")
    elif kind == "sparse_tensor_type":
        yield Need(8, f"{where}: a sparse tensor type")
        yield Need(_type_ir(tp.sparse_tensor_type.elem_type), f"{where}: {_type_name(tp.sparse_tensor_type.elem_type)}")
    elif kind == "optional_type":
        yield Need(8, f"{where}: an optional type")
        yield from _type_needs(tp.optional_type.elem_type, where)
    elif kind == "sequence_type":
        yield from _type_needs(tp.sequence_type.elem_type, where)
    elif kind == "map_type":
        yield Need(_type_ir(tp.map_type.key_type), f"{where}: {_type_name(tp.map_type.key_type)}")
        yield from _type_needs(tp.map_type.value_type, where)


def _tensor_need(tensor: onnx.TensorProto, where: str) -> Need:
    return Need(_type_ir(tensor.data_type), f"{where} {tensor.name!r}: {_type_name(tensor.data_type)}")


def _attribute_needs(attribute: onnx.AttributeProto, where: str) -> Iterator[Need]:
    if attribute.HasField("t"):
        yield _tensor_need(attribute.t, where)
    for tensor in attribute.tensors:
        yield _tensor_need(tensor, where)
    if attribute.HasField("sparse_tensor"):
        yield _tensor_need(attribute.sparse_tensor.values, where)
    if attribute.HasField("tp"):
        yield from _type_needs(attribute.tp, where)
    for tp in attribute.type_protos:
        yield from _type_needs(tp, where)
    if attribute.name in _TYPE_ATTRIBUTES and attribute.type == onnx.AttributeProto.INT:
        yield Need(_type_ir(attribute.i), f"{where}: {attribute.name}={_type_name(attribute.i)}")
    if attribute.HasField("g"):
        yield from _graph_needs(attribute.g)
    for graph in attribute.graphs:
        yield from _graph_needs(graph)


def _node_needs(nodes: Iterable[onnx.NodeProto]) -> Iterator[Need]:
    for node in nodes:
        where = f"node {node.name or node.op_type!r}"
        if node.overload:
            yield Need(10, f"{where}: a function overload")
        for attribute in node.attribute:
            yield from _attribute_needs(attribute, where)


def _graph_needs(graph: onnx.GraphProto) -> Iterator[Need]:
    for tensor in graph.initializer:
        yield _tensor_need(tensor, "initializer")
    for sparse in graph.sparse_initializer:
        yield _tensor_need(sparse.values, "sparse initializer")
    for value in (*graph.input, *graph.output, *graph.value_info):
        yield from _type_needs(value.type, f"value {value.name!r}")
    yield from _node_needs(graph.node)


def _model_needs(model: onnx.ModelProto) -> Iterator[Need]:
    yield Need(helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True), "its opset imports")
    if model.functions:
        yield Need(8, "model-local functions")
    for function in model.functions:
        if function.attribute_proto:
            yield Need(9, f"function {function.name!r}: attribute defaults")
        if function.overload:
            yield Need(10, f"function {function.name!r}: an overload")
        for value in function.value_info:
            yield from _type_needs(value.type, f"function {function.name!r}")
        yield from _node_needs(function.node)
    if len(getattr(model, "configuration", ())):  # onnx >= 1.19
        yield Need(11, "multi-device configurations")
    yield from _graph_needs(model.graph)


def required_ir_version(model: onnx.ModelProto) -> Need:
    """The oldest IR version that describes everything in ``model``, and what decided it."""
    return max(_model_needs(model), key=lambda need: need.ir_version)
