"""KServe v2 gRPC messages ↔ the OIP REST binary tensor bodies that the gateway forwards.

A ``ModelInferRequest`` becomes one binary-extension body (JSON header, then each input's
bytes: ``raw_input_contents`` as they came, typed ``contents`` packed little-endian), with
every output asked for as binary data; the node's answer is cut back into
``raw_output_contents``. So the gRPC gateway runs through the very proxy, router, breakers,
retries and limits of the REST one, and nothing is decoded into tensors on the way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from fleetwire.datatypes import OIP_DTYPE_NAMES
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve.tensors import ContentsError, encode_bytes_elements, parameters_of, typed_contents

#: Headers of the forwarded REST request besides the body's JSON length.
_CONTENT_TYPE = "application/octet-stream"


class ConvertError(ValueError):
    """A request or answer that cannot be carried across (``status``: the HTTP status it means)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _input_bytes(request: pb.ModelInferRequest, index: int) -> bytes:
    tensor = request.inputs[index]
    if request.raw_input_contents:
        return bytes(request.raw_input_contents[index])
    try:
        flat = typed_contents(tensor.contents, tensor.datatype, tensor.name)
    except ContentsError as exc:
        raise ConvertError(str(exc)) from None
    if flat.dtype == np.object_:
        return encode_bytes_elements(flat)
    return flat.tobytes()


def rest_request(request: pb.ModelInferRequest) -> tuple[bytes, dict[str, str]]:
    """The binary-extension body and headers of ``request`` (ConvertError on a malformed one)."""
    if not request.inputs:
        raise ConvertError("a request needs at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise ConvertError(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs")
    if raw and any(t.HasField("contents") for t in request.inputs):
        raise ConvertError("contents and raw_input_contents are both set; send one")
    inputs, blobs = [], []
    for i, tensor in enumerate(request.inputs):
        blob = _input_bytes(request, i)
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    doc: dict[str, Any] = {
        "inputs": inputs,
        "parameters": {**parameters_of(request.parameters), "binary_data_output": True},
    }
    if request.id:
        doc["id"] = request.id
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}} for o in request.outputs]
    header = orjson.dumps(doc)
    headers = {"content-type": _CONTENT_TYPE, "inference-header-content-length": str(len(header))}
    return header + b"".join(blobs), headers


def error_message(body: bytes) -> str:
    """The ``error`` of an OIP error body, else the body as text."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:1000]
    return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)


def _json_output(entry: dict[str, Any]) -> bytes:
    """An output a node answered as JSON ``data`` (it was asked for binary), packed raw."""
    datatype = entry.get("datatype", "")
    data = entry.get("data", [])
    if datatype == "BYTES":
        return encode_bytes_elements(data)
    if datatype not in OIP_DTYPE_NAMES:
        raise ConvertError(f"the node answered output {entry.get('name')!r} as unknown datatype {datatype!r}", 502)
    return np.asarray(data, dtype=OIP_DTYPE_NAMES[datatype]).tobytes()


def grpc_response(body: bytes, headers: Mapping[str, str]) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` of a node's 200 answer (JSON, or JSON + binary outputs)."""
    raw_length = headers.get("Inference-Header-Content-Length")
    length = int(raw_length) if raw_length is not None and raw_length.isdigit() else len(body)
    try:
        doc = orjson.loads(body[:length])
    except orjson.JSONDecodeError as exc:
        raise ConvertError(f"the node's answer is no OIP response: {exc}", 502) from None
    response = pb.ModelInferResponse(
        model_name=doc.get("model_name", ""), model_version=doc.get("model_version", ""), id=doc.get("id", "")
    )
    offset = length
    for entry in doc.get("outputs", []):
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is None:
            blob = _json_output(entry)
        else:
            blob, offset = body[offset : offset + size], offset + size
        response.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        response.raw_output_contents.append(blob)
    return response
