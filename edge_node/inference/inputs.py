"""The one check of a request's tensors against the model's signature.

Every inference passes here once, in ``LoadedModel.infer``, whichever transport carried it
(REST, KServe gRPC) or none (a direct caller): a wrong name, datatype, rank, size or batch
axis is an :class:`~edge_node.errors.InvalidInputs` (400) that says which, never an ONNX
Runtime error (500), and it is refused before it joins a batch, so one bad request cannot
fail the requests it would have been batched with. The batcher relies on it (every input has
the same, non-empty first axis). Datatypes are named as the Open Inference Protocol names
them (FP32, INT64, BYTES), as clients send them."""

from __future__ import annotations

import numpy as np

from edge_node.errors import InvalidInputs
from edge_node.inference.datatypes import NUMPY_TO_OIP, oip_datatype
from fleetwire.manifest import TensorSpec

__all__ = ["check_inputs", "check_outputs"]


def _datatype_name(array: np.ndarray) -> str:
    return NUMPY_TO_OIP.get(array.dtype.name, array.dtype.name)


def _dtype_matches(array: np.ndarray, dtype: str) -> bool:
    if dtype == "object":
        return array.dtype.kind in "OUS"
    try:
        return array.dtype == np.dtype(dtype)
    except TypeError:  # a dtype numpy does not know (bfloat16): compare by name
        return array.dtype.name == dtype


def _check_one(spec: TensorSpec, array: np.ndarray) -> None:
    if not _dtype_matches(array, spec.dtype):
        raise InvalidInputs(
            f"input {spec.name!r} has datatype {_datatype_name(array)}; the model expects {oip_datatype(spec.dtype)}"
        )
    if array.ndim != len(spec.shape):
        raise InvalidInputs(
            f"input {spec.name!r} has shape {list(array.shape)} (rank {array.ndim}); "
            f"the model expects rank {len(spec.shape)}: {spec.shape}"
        )
    for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
        if want >= 0 and got != want:
            raise InvalidInputs(f"input {spec.name!r} dimension {axis} is {got}; the model expects {want}")


def _check_batch(inputs: dict[str, np.ndarray]) -> None:
    """Every input shares one non-empty first (batch) axis: what the batcher splits on."""
    scalars = [name for name, a in inputs.items() if not a.ndim]
    if scalars:
        raise InvalidInputs(f"every input needs a first (batch) dimension; {scalars[0]!r} is a scalar")
    batch = {a.shape[0] for a in inputs.values()}
    if len(batch) > 1:
        raise InvalidInputs(f"inputs disagree on the batch dimension: {sorted(batch)}")
    if batch == {0}:
        raise InvalidInputs("the batch is empty (first dimension 0)")


def check_inputs(inputs: dict[str, np.ndarray], specs: list[TensorSpec]) -> None:
    """Raise InvalidInputs unless ``inputs`` has exactly ``specs``' names, datatypes, ranks
    and fixed dimensions, and one non-empty batch axis."""
    by_name = {s.name: s for s in specs}
    for name in inputs:
        if name not in by_name:
            raise InvalidInputs(f"the model has no input {name!r}; its inputs are: {', '.join(by_name)}")
    for spec in specs:
        if spec.name not in inputs:
            raise InvalidInputs(f"missing input {spec.name!r}")
        _check_one(spec, inputs[spec.name])
    _check_batch(inputs)


def check_outputs(requested: list[str] | None, specs: list[TensorSpec]) -> None:
    """Raise InvalidInputs unless every output ``requested`` (None: all) is one the model has."""
    known = [o.name for o in specs]
    for name in requested or []:
        if name not in known:
            raise InvalidInputs(f"the model has no output {name!r}; its outputs are: {', '.join(known)}")
