"""What the installed ONNX Runtime can load: its highest IR version and operator-set versions.

``onnx.checker`` judges a model against the ``onnx`` package, which is usually newer than
the ONNX release ONNX Runtime was built with: a model stamped with ``onnx``'s own IR version
(``onnx.helper.make_model``'s default) or a fresh opset passes the checker and then fails to
load on every edge. ONNX Runtime has no API that says what it supports, so it is asked the
way an edge would be: by loading a one-node model at a given IR version and opset. The
answers are monotonic, so a binary search over a few versions finds each limit; it runs
once per process (a few milliseconds) and is cached."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

DEFAULT_DOMAIN = ""
ML_DOMAIN = "ai.onnx.ml"
#: Relu's newest version (14) is valid at every opset from 14 on: the probe's one node.
_PROBE_OPSET = 14
#: IR version 7 is the oldest that has opset 14; no ONNX Runtime in use loads less.
_MIN_IR = 7
#: How far past the ``onnx`` package's own newest version the search looks (ONNX Runtime may
#: be built with a newer ONNX than the installed package).
_HEADROOM = 8


@dataclass(frozen=True)
class RuntimeLimits:
    """The newest model format the installed ONNX Runtime loads."""

    #: E.g. "onnxruntime 1.31.1".
    runtime: str
    max_ir_version: int
    #: Newest opset per operator domain: "" (ai.onnx) and "ai.onnx.ml".
    max_opsets: Mapping[str, int]

    def max_opset(self, domain: str) -> int | None:
        """The newest opset of ``domain`` (``ai.onnx`` is ""); None for a domain not probed."""
        return self.max_opsets.get("" if domain == "ai.onnx" else domain)


def _probe_model(ir_version: int, opsets: Mapping[str, int]) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = ir_version
    return model.SerializeToString()


def _loads(ir_version: int, opsets: Mapping[str, int]) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # a refused probe is an answer, not something to log
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(_probe_model(ir_version, opsets), options, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def _highest(low: int, high: int, accepted: Callable[[int], bool]) -> int:
    """The highest value in ``low..high`` that ``accepted`` (``low`` is assumed accepted)."""
    while low < high:
        middle = (low + high + 1) // 2
        if accepted(middle):
            low = middle
        else:
            high = middle - 1
    return low


@functools.cache
def runtime_limits() -> RuntimeLimits:
    """The installed ONNX Runtime's limits, probed on first use."""
    import onnxruntime as ort

    top_ir = max(onnx.IR_VERSION, _MIN_IR) + _HEADROOM
    max_ir = _highest(_MIN_IR, top_ir, lambda ir: _loads(ir, {DEFAULT_DOMAIN: _PROBE_OPSET}))
    top_opset = onnx.defs.onnx_opset_version() + _HEADROOM
    max_opset = _highest(_PROBE_OPSET, top_opset, lambda v: _loads(max_ir, {DEFAULT_DOMAIN: v}))
    max_ml = _highest(1, 1 + _HEADROOM * 2, lambda v: _loads(max_ir, {DEFAULT_DOMAIN: _PROBE_OPSET, ML_DOMAIN: v}))
    return RuntimeLimits(
        runtime=f"onnxruntime {ort.__version__}",
        max_ir_version=max_ir,
        max_opsets={DEFAULT_DOMAIN: max_opset, ML_DOMAIN: max_ml},
    )
