"""Decoding OIP v2 inference requests into numpy and encoding responses, JSON and
binary (Triton's binary tensor data extension).

Binary layout: the body starts with ``Inference-Header-Content-Length`` bytes of
JSON; the tensors whose ``parameters.binary_data_size`` is set follow, in the order
they appear in the JSON. BYTES elements are each a 4-byte little-endian length and
the bytes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from edge_node.errors import InvalidRequest
from edge_node.inference.datatypes import OIP_TO_NUMPY, oip_datatype
from edge_node.inference.request import InferRequest
from edge_node.inference.tensors import check_elements, decode_bytes_elements, reshape_flat
from fleetwire.kserve.tensors import encode_bytes_elements

HEADER_LENGTH = "inference-header-content-length"


def _json_part(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    if header_length is None:
        header, rest = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise InvalidRequest(
                f"Inference-Header-Content-Length {header_length} exceeds the body of {len(body)} bytes"
            )
        header, rest = body[:header_length], body[header_length:]
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")
    return doc, memoryview(rest)


def _shape(tensor: dict[str, Any], name: str) -> list[int]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequest(f"input {name!r}: shape must be a list of non-negative integers")
    return shape


def _integers(data: Any, dtype: np.dtype, name: str) -> np.ndarray:
    """JSON numbers as ``dtype`` integers, refusing what a plain cast would silently change:
    a fraction (1.5 would become 1), a value outside the dtype's range, a bool or a string."""
    values = np.asarray(data)
    datatype = oip_datatype(dtype.name)
    if values.dtype.kind not in "iuf":
        raise InvalidRequest(f"input {name!r}: datatype {datatype} needs integers, the data holds {values.dtype}")
    if values.dtype == dtype or not values.size:  # parsed as the very dtype (INT64 ids): nothing can be off
        return values.astype(dtype, copy=False).ravel()
    info, low, high = np.iinfo(dtype), values.min(), values.max()
    if values.dtype.kind == "f":
        whole = np.isfinite(values) & (values == np.floor(values))
        if not whole.all():
            raise InvalidRequest(f"input {name!r}: {values[~whole].flat[0]} is not an integer (datatype {datatype})")
        too_high = high >= info.max + 1  # float(2**63 - 1) rounds up to 2**63: compare with the bound above
    else:
        too_high = high > info.max
    if low < info.min or too_high:
        outside = low if low < info.min else high
        raise InvalidRequest(f"input {name!r}: {outside} is outside the range of {datatype} [{info.min}, {info.max}]")
    return values.astype(dtype, copy=False).ravel()


def _out_of_range(name: str, dtype: np.dtype) -> str:
    return f"input {name!r}: a value is outside the range of {oip_datatype(dtype.name)}"


def _from_json_data(data: Any, dtype: np.dtype, shape: list[int], name: str) -> np.ndarray:
    if data is None:
        raise InvalidRequest(f"input {name!r}: no data")
    try:
        if dtype == np.object_:
            items = np.ravel(np.array(data, dtype=object))
            flat = np.array([d.encode() if isinstance(d, str) else d for d in items], dtype=object)
        elif dtype.kind in "iu":
            flat = _integers(data, dtype, name)
        else:
            # JSON has no inf or nan (orjson refuses them), so a non-finite value here is one
            # the cast overflowed (1e39 as FP32): looking afterwards costs half of running
            # every cast under np.errstate (numpy warns on such a cast; warnings-as-errors
            # turn that into the RuntimeWarning caught below).
            flat = np.asarray(data, dtype=dtype).ravel()
            if not np.isfinite(flat).all():
                raise InvalidRequest(_out_of_range(name, dtype))
    except RuntimeWarning as exc:
        raise InvalidRequest(_out_of_range(name, dtype)) from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"input {name!r}: data does not match datatype {dtype.name}: {exc}") from exc
    return reshape_flat(flat, shape, name)


def _decode_input(
    tensor: Any, binary: memoryview, offset: int, max_elements: int | None = None
) -> tuple[str, np.ndarray, int]:
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise InvalidRequest("every input needs a string 'name'")
    name = tensor["name"]
    raw_datatype = tensor.get("datatype")
    dtype = OIP_TO_NUMPY.get(raw_datatype) if isinstance(raw_datatype, str) else None
    if dtype is None:
        raise InvalidRequest(f"input {name!r}: unknown datatype {raw_datatype!r}")
    datatype = str(raw_datatype)
    shape = _shape(tensor, name)
    check_elements(shape, name, max_elements)
    params = tensor.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is None:
        return name, _from_json_data(tensor.get("data"), dtype, shape, name), offset
    if not isinstance(size, int) or size < 0 or offset + size > len(binary):
        raise InvalidRequest(f"input {name!r}: binary_data_size {size} does not fit the binary part of the body")
    raw = binary[offset : offset + size]
    if dtype == np.object_:
        array = decode_bytes_elements(raw, math.prod(shape), name).reshape(shape)
    else:
        if size % dtype.itemsize:
            raise InvalidRequest(f"input {name!r}: {size} bytes is not a whole number of {datatype} elements")
        array = reshape_flat(np.frombuffer(raw, dtype=dtype), shape, name)
    return name, array, offset + size


def _requested_outputs(doc: dict[str, Any]) -> tuple[list[str] | None, set[str]]:
    outputs = doc.get("outputs")
    if outputs is None:
        return None, set()
    if not isinstance(outputs, list):
        raise InvalidRequest("'outputs' must be a list")
    names, binary = [], set()
    for o in outputs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidRequest("every requested output needs a string 'name'")
        names.append(o["name"])
        params = o.get("parameters") or {}
        if isinstance(params, dict) and params.get("binary_data"):
            binary.add(o["name"])
    return names, binary


def decode_request(body: bytes, header_length: int | None, max_elements: int | None = None) -> InferRequest:
    """Parse an inference request body (JSON, or JSON + binary tensors); an input whose
    shape declares more than ``max_elements`` elements is refused (TensorTooLarge, 413)."""
    doc, binary = _json_part(body, header_length)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("'inputs' must be a non-empty list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in raw_inputs:
        name, array, offset = _decode_input(tensor, binary, offset, max_elements)
        if name in inputs:
            raise InvalidRequest(f"input {name!r} appears twice")
        inputs[name] = array
    if offset != len(binary):
        raise InvalidRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    requested, binary_outputs = _requested_outputs(doc)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidRequest("'parameters' must be an object")
    request_id = doc.get("id")
    return InferRequest(
        id=str(request_id) if request_id is not None else None,
        inputs=inputs,
        requested_outputs=requested,
        binary_outputs=binary_outputs,
        binary_default=bool(params.get("binary_data_output", False)),
        parameters=params,
    )


def _json_data(array: np.ndarray) -> list[Any]:
    if array.dtype == np.object_:
        return [x.decode(errors="replace") if isinstance(x, bytes) else x for x in array.ravel().tolist()]
    return array.ravel().tolist()


_DATATYPES: dict[np.dtype, str] = {}


def _datatype_of(dtype: np.dtype) -> str:
    """The OIP datatype of an output's dtype (cached: a dtype's ``.name`` is slow to build)."""
    found = _DATATYPES.get(dtype)
    if found is None:
        found = _DATATYPES[dtype] = oip_datatype("object" if dtype == np.object_ else dtype.name)
    return found


def encode_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    entries, blobs = [], []
    for name, array in outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": _datatype_of(array.dtype), "shape": list(array.shape)}
        if request.binary_default or name in request.binary_outputs:
            raw = (
                encode_bytes_elements(array.ravel())
                if array.dtype == np.object_
                else np.ascontiguousarray(array).tobytes()
            )
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_data(array)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)
