"""OIP v2 (KServe v2 / Triton) tensor datatype names and the numpy dtype names they stand
for: the edge decodes requests with them, and central's gateway describes a model from
its manifest (``TensorSpec.dtype`` holds numpy names) in the same words an edge uses."""

from __future__ import annotations

#: OIP datatype → numpy dtype name.
OIP_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
#: numpy dtype name → OIP datatype (strings of every kind are BYTES).
NUMPY_TO_OIP: dict[str, str] = {numpy: oip for oip, numpy in OIP_DTYPE_NAMES.items()} | {
    "str": "BYTES",
    "bytes": "BYTES",
}


def oip_datatype(numpy_name: str) -> str:
    """The OIP name of a numpy dtype name ("float32" → "FP32"); unknown names upper-cased."""
    return NUMPY_TO_OIP.get(numpy_name, numpy_name.upper())
