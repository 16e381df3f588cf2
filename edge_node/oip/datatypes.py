"""OIP v2 datatype names ↔ numpy dtypes."""

from __future__ import annotations

import numpy as np

OIP_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
NUMPY_TO_OIP: dict[str, str] = {dt.name: name for name, dt in OIP_TO_NUMPY.items() if name != "BYTES"}
NUMPY_TO_OIP["object"] = "BYTES"
NUMPY_TO_OIP["str"] = "BYTES"
NUMPY_TO_OIP["bytes"] = "BYTES"


def oip_datatype(numpy_name: str) -> str:
    """The OIP name of a numpy dtype name ("float32" → "FP32")."""
    return NUMPY_TO_OIP.get(numpy_name, numpy_name.upper())
