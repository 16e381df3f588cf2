"""What the installed ONNX Runtime can load: its highest IR version and operator-set versions.

``onnx.checker`` judges a model against the ``onnx`` package, which is usually newer than
the ONNX release ONNX Runtime was built with: a model stamped with ``onnx``'s own IR version
(``onnx.helper.make_model``'s default) or a fresh opset passes the checker and then fails to
load on every edge. ONNX Runtime has no API that says what it supports, so it is asked the
way an edge would be: by loading a one-node model at a given IR version and opset. The
answers are monotonic, so a binary search over a few versions finds each limit; it runs
once per process (25 ms measured with onnxruntime 1.31.1 on this 2-core host) and is cached.

Central probes its own runtime to judge a push; every edge probes its own the same way and
reports the limits when it registers (``RegisterRequest.runtime``, ``max_ir_version``,
``max_opsets``), so central never hands a node an artifact its runtime cannot load. An
operator may cap what an edge reports (``capped``): to pin a fleet to an older format, and
for tests that need an old runtime without installing one."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DEFAULT_DOMAIN",
    "FORMATS_KEY",
    "HEADROOM",
    "ML_DOMAIN",
    "ModelFormat",
    "RuntimeLimits",
    "manifest_formats",
    "runtime_limits",
]

DEFAULT_DOMAIN = ""
ML_DOMAIN = "ai.onnx.ml"
#: Relu's newest version (14) is valid at every opset from 14 on: the probe's one node.
_PROBE_OPSET = 14
#: IR version 7 is the oldest that has opset 14; no ONNX Runtime in use loads less.
_MIN_IR = 7
#: How far past the ``onnx`` package's own newest version the search looks (ONNX Runtime may
#: be built with a newer ONNX than the installed package).
HEADROOM = 8


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
        return self.max_opsets.get(_domain(domain))

    def capped(self, max_ir_version: int | None = None, max_opset: int | None = None) -> RuntimeLimits:
        """These limits, lowered to ``max_ir_version`` and (``ai.onnx``) ``max_opset`` where
        those are lower; the runtime's name says it was capped."""
        ir = min(self.max_ir_version, max_ir_version) if max_ir_version is not None else self.max_ir_version
        opsets = dict(self.max_opsets)
        if max_opset is not None and DEFAULT_DOMAIN in opsets:
            opsets[DEFAULT_DOMAIN] = min(opsets[DEFAULT_DOMAIN], max_opset)
        if ir == self.max_ir_version and opsets == dict(self.max_opsets):
            return self
        return replace(
            self, runtime=f"{self.runtime.split(' (capped')[0]} (capped)", max_ir_version=ir, max_opsets=opsets
        )

    def refusal(self, model: ModelFormat) -> str | None:
        """Why this runtime cannot load a model of format ``model`` (None: it can). A domain
        this runtime was not probed for is not held against the model (custom operators are
        the execution provider's business)."""
        if model.ir_version > self.max_ir_version:
            return (
                f"IR version {model.ir_version} is newer than IR {self.max_ir_version}, the newest {self.runtime} loads"
            )
        for domain, version in sorted(model.opsets.items()):
            newest = self.max_opset(domain)
            if newest is not None and version > newest:
                name = domain or "ai.onnx"
                return f"opset {version} of {name} is newer than opset {newest}, the newest {self.runtime} loads"
        return None

    def as_json(self) -> dict[str, Any]:
        """JSON-friendly form (the REST API, the shared fleet store)."""
        return {"runtime": self.runtime, "max_ir_version": self.max_ir_version, "max_opsets": dict(self.max_opsets)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RuntimeLimits:
        """The inverse of ``as_json``; raises ``ValueError``/``KeyError``/``TypeError`` on a bad body."""
        opsets = {_domain(str(k)): int(v) for k, v in dict(body["max_opsets"]).items()}
        return cls(runtime=str(body["runtime"]), max_ir_version=int(body["max_ir_version"]), max_opsets=opsets)


@dataclass(frozen=True)
class ModelFormat:
    """What a model's graph file asks of the runtime: its IR version and opset per domain."""

    ir_version: int
    #: Opset per operator domain, ``ai.onnx`` as "".
    opsets: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelFormat:
        """The format ``model`` is stamped with."""
        opsets: dict[str, int] = {}
        for o in model.opset_import:
            domain = _domain(o.domain)
            opsets[domain] = max(opsets.get(domain, 0), int(o.version))
        return cls(int(model.ir_version), opsets)

    def as_json(self) -> dict[str, Any]:
        """JSON-friendly form (the push report's ``formats``)."""
        return {"ir_version": self.ir_version, "opsets": dict(self.opsets)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ModelFormat:
        """The inverse of ``as_json``; raises ``ValueError``/``KeyError``/``TypeError`` on a bad body."""
        return cls(int(body["ir_version"]), {_domain(str(k)): int(v) for k, v in dict(body["opsets"]).items()})


def _domain(domain: str) -> str:
    """``ai.onnx`` and "" name one domain; "" is how it is kept."""
    return DEFAULT_DOMAIN if domain == "ai.onnx" else domain


def _probe_model(ir_version: int, opsets: Mapping[str, int]) -> bytes:
    from onnx import TensorProto, helper

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
    import onnx
    import onnxruntime as ort

    top_ir = max(onnx.IR_VERSION, _MIN_IR) + HEADROOM
    max_ir = _highest(_MIN_IR, top_ir, lambda ir: _loads(ir, {DEFAULT_DOMAIN: _PROBE_OPSET}))
    top_opset = onnx.defs.onnx_opset_version() + HEADROOM
    max_opset = _highest(_PROBE_OPSET, top_opset, lambda v: _loads(max_ir, {DEFAULT_DOMAIN: v}))
    max_ml = _highest(1, 1 + HEADROOM * 2, lambda v: _loads(max_ir, {DEFAULT_DOMAIN: _PROBE_OPSET, ML_DOMAIN: v}))
    return RuntimeLimits(
        runtime=f"onnxruntime {ort.__version__}",
        max_ir_version=max_ir,
        max_opsets={DEFAULT_DOMAIN: max_opset, ML_DOMAIN: max_ml},
    )


#: Where a version's push report (``Manifest.quantization``) keeps each artifact's format.
FORMATS_KEY = "formats"


def manifest_formats(report: Mapping[str, Any] | None) -> dict[str, ModelFormat]:
    """Artifact → format, from a push report's ``formats`` (versions pushed before central
    recorded them have none: {}). An entry that cannot be read is left out."""
    found: dict[str, ModelFormat] = {}
    for name, body in dict((report or {}).get(FORMATS_KEY) or {}).items():
        try:
            found[str(name)] = ModelFormat.from_json(body)
        except (KeyError, TypeError, ValueError):
            continue
    return found
