"""KServe v2 gRPC messages ↔ the data plane's types. Protobuf stops here: the plane sees an
:class:`InferRequest` whichever transport carried it.

Inputs come as ``raw_input_contents`` (one bytes per input, read as zero-copy numpy views
over the message's bytes) or as typed ``contents``; every shape is checked against
``limits.max_tensor_elements`` before any array of it is built. Outputs always go back as
``raw_output_contents`` (what Triton's client reads)."""

from __future__ import annotations

import numpy as np

from edge_node.errors import InvalidRequest
from edge_node.inference.dataplane import InferResult
from edge_node.inference.datatypes import OIP_TO_NUMPY, oip_datatype
from edge_node.inference.request import InferRequest
from edge_node.inference.tensors import check_elements, decode_bytes_elements, reshape_flat
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve.tensors import ContentsError, encode_bytes_elements, parameters_of, typed_contents

_InputTensor = pb.ModelInferRequest.InferInputTensor


def version_of(version: str) -> str | None:
    """A request's model version: proto3's empty string means "the one the edge serves"."""
    return version or None


def _shape(tensor: _InputTensor) -> list[int]:
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise InvalidRequest(f"input {tensor.name!r}: shape must be non-negative integers, got {shape}")
    return shape


def _from_raw(tensor: _InputTensor, dtype: np.dtype, shape: list[int], raw: bytes) -> np.ndarray:
    if dtype == np.object_:
        return decode_bytes_elements(memoryview(raw), int(np.prod(shape)) if shape else 1, tensor.name).reshape(shape)
    if len(raw) % dtype.itemsize:
        raise InvalidRequest(
            f"input {tensor.name!r}: {len(raw)} bytes is not a whole number of {tensor.datatype} elements"
        )
    return reshape_flat(np.frombuffer(raw, dtype=dtype), shape, tensor.name)


def _from_contents(tensor: _InputTensor, shape: list[int]) -> np.ndarray:
    try:
        flat = typed_contents(tensor.contents, tensor.datatype, tensor.name)
    except ContentsError as exc:
        raise InvalidRequest(str(exc)) from None
    return reshape_flat(flat, shape, tensor.name)


def _raw_contents(request: pb.ModelInferRequest) -> list[bytes] | None:
    raw = list(request.raw_input_contents)
    if not raw:
        return None
    if len(raw) != len(request.inputs):
        raise InvalidRequest(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs")
    for tensor in request.inputs:
        if tensor.HasField("contents"):
            raise InvalidRequest(f"input {tensor.name!r}: contents and raw_input_contents are both set; send one")
    return raw


def decode_infer_request(request: pb.ModelInferRequest, max_elements: int | None) -> InferRequest:
    """The plane's request of a ``ModelInferRequest`` (InvalidRequest, 400, or TensorTooLarge, 413, on a bad one)."""
    if not request.inputs:
        raise InvalidRequest("a request needs at least one input")
    raw = _raw_contents(request)
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        dtype = OIP_TO_NUMPY.get(tensor.datatype)
        if dtype is None:
            raise InvalidRequest(f"input {tensor.name!r}: unknown datatype {tensor.datatype!r}")
        if tensor.name in inputs:
            raise InvalidRequest(f"input {tensor.name!r} appears twice")
        shape = _shape(tensor)
        check_elements(shape, tensor.name, max_elements)
        array = _from_raw(tensor, dtype, shape, raw[i]) if raw is not None else _from_contents(tensor, shape)
        inputs[tensor.name] = array
    requested = [o.name for o in request.outputs] or None
    return InferRequest(
        id=request.id or None,
        inputs=inputs,
        requested_outputs=requested,
        parameters=parameters_of(request.parameters),
    )


def _raw(array: np.ndarray) -> bytes:
    if array.dtype == np.object_:
        return encode_bytes_elements(array.ravel())
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def encode_infer_response(result: InferResult, request_id: str) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` of ``result``: every output in ``raw_output_contents``."""
    response = pb.ModelInferResponse(model_name=result.model.name, model_version=result.model.version, id=request_id)
    for name, array in result.outputs.items():
        dtype_name = "object" if array.dtype == np.object_ else array.dtype.name
        response.outputs.add(name=name, datatype=oip_datatype(dtype_name), shape=list(array.shape))
        response.raw_output_contents.append(_raw(array))
    return response
