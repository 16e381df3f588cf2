"""Building numpy tensors from a request's wire bytes, shared by the REST codec and the gRPC
converters so both refuse an oversized, short or ragged tensor with the same message.

Every shape is checked against ``limits.max_tensor_elements`` before any array of it is
built; BYTES elements are each a 4-byte little-endian length and the bytes (Triton's binary
tensor data, and KServe's ``raw_input_contents``)."""

from __future__ import annotations

import math
import struct

import numpy as np

from edge_node.errors import InvalidRequest, TensorTooLarge

__all__ = ["check_elements", "decode_bytes_elements", "reshape_flat"]


def check_elements(shape: list[int], name: str, limit: int | None) -> None:
    """Refuse a shape over ``limit`` elements before any array of it is built. Counted in
    Python ints, stopping once over (numpy's product would wrap; a full product of a long
    shape would cost time); a dimension over the limit beside a 0 is refused too."""
    if limit is None:
        return
    count = 1
    for dim in shape:
        count = limit + 1 if dim > limit else count * dim
        if count > limit:
            break
    if count > limit:
        raise TensorTooLarge(
            f"input {name!r}: shape {shape[:8]}{'…' if len(shape) > 8 else ''} is over the limit of"
            f" {limit} elements (limits.max_tensor_elements)"
        )


def decode_bytes_elements(raw: memoryview, count: int, name: str) -> np.ndarray:
    """``count`` length-prefixed BYTES elements of ``raw`` (InvalidRequest if they do not fill it)."""
    out, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise InvalidRequest(f"input {name!r}: binary BYTES data ends early")
        (n,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        out.append(bytes(raw[offset : offset + n]))
        offset += n
    if offset != len(raw):
        raise InvalidRequest(f"input {name!r}: binary BYTES data has {len(raw) - offset} extra bytes")
    return np.array(out, dtype=np.object_)


def reshape_flat(flat: np.ndarray, shape: list[int], name: str) -> np.ndarray:
    """``flat`` as ``shape`` (InvalidRequest when the element counts differ)."""
    expected = math.prod(shape)  # Python ints: no wrap-around, 1 for a scalar
    if flat.size != expected:
        raise InvalidRequest(f"input {name!r}: shape {shape} needs {expected} elements, data has {flat.size}")
    return flat.reshape(shape)
