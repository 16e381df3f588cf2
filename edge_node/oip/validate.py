"""Checks a decoded request against the model's signature, so a wrong name, dtype,
rank or size is a 400 that says which — never an ONNX Runtime error (500)."""

from __future__ import annotations

import numpy as np

from edge_node.oip.codec import InferRequest, OipError
from edge_node.oip.datatypes import oip_datatype
from fleetwire.manifest import TensorSpec


def _check_one(spec: TensorSpec, array: np.ndarray, datatype: str) -> None:
    expected = oip_datatype(spec.dtype)
    if datatype != expected:
        raise OipError(f"input {spec.name!r} has datatype {datatype}; the model expects {expected}")
    if array.ndim != len(spec.shape):
        raise OipError(
            f"input {spec.name!r} has shape {list(array.shape)} (rank {array.ndim}); "
            f"the model expects rank {len(spec.shape)}: {spec.shape}"
        )
    for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
        if want >= 0 and got != want:
            raise OipError(f"input {spec.name!r} dimension {axis} is {got}; the model expects {want}")


def check_request(request: InferRequest, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """Raise OipError unless ``request`` fits the model."""
    specs = {s.name: s for s in inputs}
    for name in request.inputs:
        if name not in specs:
            raise OipError(f"the model has no input {name!r}; its inputs are: {', '.join(specs)}")
    for spec in inputs:
        if spec.name not in request.inputs:
            raise OipError(f"missing input {spec.name!r}")
        _check_one(spec, request.inputs[spec.name], request.datatypes[spec.name])
    batch = {a.shape[0] for a in request.inputs.values() if a.ndim}
    if len(batch) > 1:
        raise OipError(f"inputs disagree on the batch dimension: {sorted(batch)}")
    if batch == {0}:
        raise OipError("the batch is empty (first dimension 0)")
    known = {o.name for o in outputs}
    for name in request.requested_outputs or []:
        if name not in known:
            raise OipError(f"the model has no output {name!r}; its outputs are: {', '.join(known)}")
