"""Clean what exporters leave in a graph that ONNX Runtime's quantizer trips on.

A graph that ONNX Runtime serves as pushed can still break its quantizer, whose first
move is to rewrite the graph and re-run ONNX shape inference on the result over the
shapes the file already records. What torch 2.13's default exporter writes
(``torch.onnx.export(..., dynamic_shapes=...)``) shows the two ways this goes wrong
(issue 25):

* **value_info that goes stale.** The exporter records a ``value_info`` entry for every
  initializer as well as for intermediate values. The dynamic quantizer turns each
  ``Gemm`` with ``transB=1`` into a ``MatMul`` by transposing its weight in place, the
  recorded ``[2, 384]`` of a classifier's weight now contradicts the ``[384, 2]``
  inferred, and shape inference raises "Inferred shape and existing shape differ".
  Every ``value_info`` is dropped here: each is a hint the quantizer and ONNX Runtime
  re-derive, and a hint that is not there cannot contradict anything.
* **Operators that share a name with ONNX Runtime's own.** Opset 23 brought a standard
  ``Attention`` (torch writes it at ``opset_version=23``); the quantizer picks what to do
  by operator type alone, takes it for ``com.microsoft`` ``Attention`` and writes a
  ``QAttention`` that no runtime loads. Such nodes are kept in FP32.

And what is true of exporters in general: graph outputs whose recorded shape
contradicts ONNX shape inference lose their fixed sizes (rank and type stay); nodes
without a name, or with another node's name, get unique ones (exclusions go by name);
initializers that older exporters also list as graph inputs are taken out of the
inputs (ONNX Runtime treats such a weight as overridable, not as a constant, so the
pre-processing cannot fold it, BatchNorm into Conv for one). Nothing else is touched: the
cleaned graph computes what the pushed one did, and ``Normalization.report()`` says
what changed, for the push report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from central.quantize.quantizer import shorten

#: Standard-domain operators whose ``op_type`` names a ``com.microsoft`` operator that
#: ORT's quantizer rewrites (its registries key on the type alone): Attention (opset 23).
SHADOWED_OPS = frozenset({"Attention"})
_STANDARD_DOMAINS = ("", "ai.onnx")
#: Initializers up to this many elements stay in the shape-inference probe (shapes, axes).
_PROBE_ELEMENTS = 1024


@dataclass(frozen=True)
class Normalization:
    """The cleaned model and what was changed to get it."""

    path: Path
    #: One sentence per kind of change, in the order they were made (empty: nothing to clean).
    changes: list[str] = field(default_factory=list)
    #: Nodes the quantizer must leave in FP32 (by name, as in ``path``).
    keep_fp32: list[str] = field(default_factory=list)
    #: ONNX shape inference over the cleaned graph: "strict", "relaxed" or "failed: ...".
    shape_inference: str = "strict"

    def report(self) -> dict[str, Any]:
        """The push report's ``normalized`` section."""
        return {"changes": self.changes, "kept_fp32": self.keep_fp32, "shape_inference": self.shape_inference}


def drop_value_info(model: onnx.ModelProto) -> str | None:
    """Remove every ``value_info``; what was dropped, or None."""
    entries = model.graph.value_info
    if not entries:
        return None
    initializers = {t.name for t in model.graph.initializer}
    of_weights = sum(1 for v in entries if v.name in initializers)
    count = len(entries)
    del entries[:]
    weights = f" ({of_weights} of them initializers')" if of_weights else ""
    return f"dropped {count} value_info entries{weights}: recorded shapes the quantizer's rewrites make stale"


def unique_node_names(model: onnx.ModelProto) -> str | None:
    """Name unnamed nodes and rename repeated names (the first keeps it); what changed, or None."""
    taken = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    named = renamed = 0
    for index, node in enumerate(model.graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        named, renamed = (named, renamed + 1) if node.name else (named + 1, renamed)
        candidate = f"{node.name or node.op_type}_{index}"
        while candidate in taken:
            candidate += "_"
        node.name = candidate
        taken.add(candidate)
    if not named and not renamed:
        return None
    return f"named {named} unnamed and renamed {renamed} repeated nodes (exclusions go by name)"


def initializers_out_of_inputs(model: onnx.ModelProto) -> str | None:
    """Take initializers out of the graph inputs (IR 4+ lets them be constants); what changed."""
    initializers = {t.name for t in model.graph.initializer}
    if model.ir_version < 4 or not initializers:
        return None
    kept = [v for v in model.graph.input if v.name not in initializers]
    removed = len(model.graph.input) - len(kept)
    if not removed:
        return None
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return f"took {removed} initializers out of the graph inputs (ONNX Runtime folds no overridable weight)"


def shadowed_nodes(model: onnx.ModelProto) -> list[str]:
    """Standard-domain nodes the quantizer would take for ``com.microsoft`` ones."""
    return [n.name for n in model.graph.node if n.domain in _STANDARD_DOMAINS and n.op_type in SHADOWED_OPS]


def _stub(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``, or when large a data-less copy marked external (inference reads only dims)."""
    elements = 1
    for dim in tensor.dims:
        elements *= dim
    if tensor.data_location == onnx.TensorProto.EXTERNAL or elements <= _PROBE_ELEMENTS:
        return tensor
    stub = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
    stub.data_location = onnx.TensorProto.EXTERNAL
    stub.external_data.add(key="location", value="not-loaded")
    return stub


def _probe(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its large weights: what shape inference needs, at any model size."""
    probe = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    graph = model.graph
    probe.graph.name = graph.name
    probe.graph.node.extend(graph.node)
    probe.graph.input.extend(graph.input)
    probe.graph.output.extend(graph.output)
    probe.graph.initializer.extend(_stub(t) for t in graph.initializer)
    probe.graph.sparse_initializer.extend(graph.sparse_initializer)
    return probe


def _infer(probe: onnx.ModelProto) -> None:
    """Strict ONNX shape inference over ``probe``; raises on a conflict."""
    onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True, data_prop=True)


def relax_outputs(model: onnx.ModelProto) -> list[str]:
    """Clear the fixed and named sizes of every graph output (rank and type stay); their names."""
    relaxed = []
    for output in model.graph.output:
        tensor = output.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        for dim in tensor.shape.dim:
            dim.Clear()
        relaxed.append(output.name)
    return relaxed


def check_shapes(model: onnx.ModelProto) -> tuple[str, str | None]:
    """("strict" | "relaxed" | "failed: ...", the change made): shape inference over the
    graph, relaxing the outputs' recorded shapes once when they are what conflicts."""
    probe = _probe(model)
    try:
        _infer(probe)
        return "strict", None
    except Exception as exc:  # InferenceError, or a checker error from a malformed graph
        first = shorten(exc)
    relaxed = relax_outputs(probe)
    try:
        _infer(probe)
    except Exception:  # the outputs were not the conflict: the quantizer will say what is
        return f"failed: {first}", None
    relax_outputs(model)
    return "relaxed", f"relaxed the recorded shapes of outputs {', '.join(relaxed)} ({first})"


def normalize(fp32: Path, out: Path, *, external_data: bool = False) -> Normalization:
    """The cleaned copy of ``fp32`` at ``out`` (graph plus ``out.data`` when ``external_data``),
    or ``Normalization(fp32)`` with no changes when there was nothing to clean."""
    model = onnx.load(str(fp32))
    changes = [c for c in (drop_value_info(model), initializers_out_of_inputs(model)) if c]
    inference, relaxed = check_shapes(model)
    changes += [c for c in (relaxed, unique_node_names(model)) if c]
    keep = shadowed_nodes(model)
    if keep:
        opset = max((o.version for o in model.opset_import if o.domain in _STANDARD_DOMAINS), default=0)
        changes.append(
            f"kept {len(keep)} ai.onnx {'/'.join(sorted(SHADOWED_OPS))} nodes (opset {opset}) in FP32: "
            "ORT's quantizer takes them for com.microsoft ones"
        )
    if not changes:
        return Normalization(fp32, shape_inference=inference)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out), save_as_external_data=external_data, location=out.name + ".data")
    return Normalization(out, changes, keep, inference)
