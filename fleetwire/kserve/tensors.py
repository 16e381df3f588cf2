"""Tensors in KServe v2 gRPC messages: the typed ``contents`` field of each datatype, and the
layout of ``raw_input_contents`` / ``raw_output_contents`` (little-endian, row-major; a BYTES
element is a 4-byte little-endian length and its bytes, as in the REST binary extension).
An edge decodes requests with these and central's gateway re-encodes them for the REST hop."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from fleetwire.datatypes import OIP_DTYPE_NAMES

__all__ = [
    "CONTENTS_FIELDS",
    "ContentsError",
    "encode_bytes_elements",
    "parameter_value",
    "parameters_of",
    "typed_contents",
]

#: OIP datatype → the ``InferTensorContents`` field that carries it (FP16 has none: raw only).
CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
#: The numpy dtype each contents field holds before it is narrowed to the tensor's datatype.
_FIELD_DTYPES = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


class ContentsError(ValueError):
    """Typed contents that cannot stand for the tensor's datatype."""


def typed_contents(contents: Any, datatype: str, name: str) -> np.ndarray:
    """The flat array that ``contents`` (an ``InferTensorContents``) holds for a ``datatype``
    tensor; ContentsError when the datatype has no typed field or a value does not fit it
    (300 in an INT8 tensor's ``int_contents``)."""
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise ContentsError(f"input {name!r}: datatype {datatype} has no typed contents; send raw_input_contents")
    values = getattr(contents, field)
    if field == "bytes_contents":
        return np.array(list(values), dtype=np.object_)
    wide = np.fromiter(values, dtype=_FIELD_DTYPES[field], count=len(values))
    dtype = np.dtype(OIP_DTYPE_NAMES[datatype])
    if dtype != wide.dtype and dtype.kind in "iu" and wide.size:
        info = np.iinfo(dtype)
        low, high = wide.min(), wide.max()
        if low < info.min or high > info.max:
            outside = low if low < info.min else high
            raise ContentsError(f"input {name!r}: {outside} is outside the range of {datatype}")
    return wide.astype(dtype, copy=False)


def encode_bytes_elements(items: Any) -> bytes:
    """BYTES elements (bytes, or str as UTF-8) in the raw layout: each a 4-byte LE length and the bytes."""
    parts = []
    for item in items:
        b = item if isinstance(item, bytes) else str(item).encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def parameters_of(parameters: Any) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values (``priority`` → int…)."""
    return {key: parameter_value(value) for key, value in parameters.items()}


def parameter_value(parameter: Any) -> Any:
    """The Python value of one ``InferParameter`` (None when none of its fields is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, which) if which is not None else None
