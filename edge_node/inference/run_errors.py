"""What an exception from a session run means: the request's fault (400) or the node's (500).

ONNX Runtime raises ``InvalidArgument`` for a value a kernel refuses (a Gather index past
an embedding's vocabulary), and ``Fail`` or ``RuntimeException`` when a check inside a
kernel trips on the data (shapes that cannot broadcast, a size that overflows). The same
two classes carry a failed allocation. Every session ran a warm-up request at load, so a
kernel refusing one request's values is that request's fault, unless the message says
memory or a device failed: those, and anything that is not an ONNX Runtime error, are
the node's. The batcher runs a failed batch's requests one by one, so the request whose
data is bad is the one that gets the error."""

from __future__ import annotations

import re

import numpy as np

from edge_node.errors import EdgeError, InferenceFailed, InvalidRequestData

Tensors = dict[str, np.ndarray]

#: Error classes of ``onnxruntime.capi.onnxruntime_pybind11_state`` that a request's data can cause.
_DATA_ERRORS = frozenset({"InvalidArgument", "Fail", "RuntimeException"})
#: What the node (memory, device, execution provider) failed at, whatever the class says.
_NODE_FAULT = re.compile(
    r"bad[_ ]?alloc|failed to allocate|out of memory|CUDA (?:failure|error)|cudaError|CUDNN_STATUS|CUBLAS_STATUS"
    r"|TensorRT|device reset|EP_FAIL",
    re.IGNORECASE,
)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_NODE = re.compile(r"Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: ")
#: ``/onnxruntime_src/…/element_wise_ops.h:583 void f(ptrdiff_t) axis == 1 was false. `` before the reason.
_SOURCE = re.compile(r"\S+\.(?:h|hpp|cc|cpp|cu):\d+ [^()]*\([^()]*\)(?: const)? (?:.*? was false\. )?")
_INDEX = re.compile(r"\bidx=(-?\d+)")
_MAX_MESSAGE = 600


def _is_ort(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("onnxruntime")


def _reason(text: str) -> tuple[str, str | None]:
    """ORT's message without its code prefix and C++ source location, and where it
    happened (``node 'embed' (Gather)``) when a node failed."""
    text = _PREFIX.sub("", text.strip())
    where = None
    if (node := _NODE.search(text)) is not None:
        where = f"node {node.group(2)!r} ({node.group(1)})"
        text = text[node.end() :]
    return _SOURCE.sub("", text).strip(), where


def _holding(inputs: Tensors, value: int) -> list[str]:
    """The integer inputs that hold ``value``."""
    return [n for n, a in inputs.items() if a.dtype.kind in "iu" and a.size and bool((a == value).any())]


def _shapes(inputs: Tensors) -> str:
    return ", ".join(f"{n!r} {list(a.shape)}" for n, a in inputs.items())


def _data_error(text: str, inputs: Tensors) -> InvalidRequestData:
    reason, where = _reason(text)
    at = f" at {where}" if where else ""
    index = _INDEX.search(reason)
    value = int(index.group(1)) if index is not None else None
    culprits = _holding(inputs, value) if value is not None else []
    if culprits:
        named = " and ".join(repr(n) for n in culprits)
        message = f"input {named} holds {value}, a value the model cannot take{at}: {reason}"
    else:
        message = f"the model cannot run on this request's data{at}: {reason}"
        if len(inputs) > 1:
            message += f" (input shapes: {_shapes(inputs)})"
    return InvalidRequestData(message[:_MAX_MESSAGE])


def explain_run_error(exc: Exception, inputs: Tensors) -> Exception:
    """The error a caller should see for ``exc``, raised by running ``inputs``:
    InvalidRequestData when the data caused it, InferenceFailed when the node did; the
    project's own errors (ModelUnavailable, InvalidInputs…) unchanged."""
    if isinstance(exc, EdgeError):
        return exc
    text = str(exc)
    if isinstance(exc, MemoryError) or _NODE_FAULT.search(text):
        return InferenceFailed(f"the node ran out of memory or its device failed: {_reason(text)[0][:_MAX_MESSAGE]}")
    if _is_ort(exc) and type(exc).__name__ in _DATA_ERRORS:
        return _data_error(text, inputs)
    if isinstance(exc, ValueError):  # the binding's own checks: a missing input, a feed it cannot convert
        return InvalidRequestData(f"the model cannot run on this request's data: {text[:_MAX_MESSAGE]}")
    return InferenceFailed(f"the node failed to run the request: {type(exc).__name__}: {text[:_MAX_MESSAGE]}")
