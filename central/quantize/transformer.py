"""ONNX Runtime's transformer optimizer, run before a transformer is quantized.

Exported encoders spell attention, LayerNorm and GELU as dozens of small ops; the
optimizer fuses them into ``Attention``, ``SkipLayerNormalization`` and ``BiasGelu``
(com.microsoft ops that ORT's CPU kernels run fast), and the dynamic quantizer then
turns ``Attention`` into ``QAttention`` and the MatMuls into integer MatMuls. Static
calibration of the unfused graph fails on such models ("Incomplete symbolic shape
inference"), which is why transformers are quantized dynamically after this.

``model_type="bert"`` with ``num_heads=0, hidden_size=0`` makes the fusions read
heads and width from the graph's own Reshape shapes; ``opt_level=0`` runs the
fusions only (ORT's own graph optimisation happens in the edge's session anyway,
and the optimizer's ORT pass imports torch). The fused model must load in a CPU
session; if the optimizer raises or its result does not load, the raw model is
quantized and the note says why."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnxruntime as ort

MODEL_TYPE = "bert"
#: The optimizer warns about producers other than PyTorch on every call; not news.
_QUIET = ("onnxruntime.transformers", "onnxruntime.transformers.optimizer", "onnxruntime.transformers.onnx_model")


@dataclass(frozen=True)
class Optimized:
    """The fused model (or the input when fusing failed), and what happened."""

    path: Path
    fused: dict[str, int] = field(default_factory=dict)
    note: str | None = None


def _quiet() -> None:
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)


def _new_operators(fp32: Path, statistics: dict[str, int]) -> dict[str, int]:
    """The optimizer's counts less the nodes of that type the input already had: an exported
    graph's own ``LayerNormalization`` or (opset 23) ``Attention`` is nothing it fused."""
    had = Counter(n.op_type for n in onnx.load(str(fp32), load_external_data=False).graph.node)
    return {op: int(n) - had[op] for op, n in statistics.items() if int(n) > had[op]}


def optimize_transformer(fp32: Path, out: Path, *, external_data: bool = False) -> Optimized:
    """Fuse attention/LayerNorm/GELU into ``out``; ``Optimized(fp32, note=...)`` on failure."""
    from onnxruntime.transformers.optimizer import optimize_model  # heavy; transformers only

    _quiet()
    try:
        model = optimize_model(str(fp32), model_type=MODEL_TYPE, num_heads=0, hidden_size=0, opt_level=0)
        fused = _new_operators(fp32, model.get_fused_operator_statistics())
        model.save_model_to_file(str(out), use_external_data_format=external_data)
        ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    except Exception as exc:  # the optimizer raises whatever its pattern matching trips on
        out.unlink(missing_ok=True)
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return Optimized(fp32, note=f"transformer optimizer failed, raw model quantized: {reason[:200]}")
    return Optimized(out, fused, None if fused else "transformer optimizer found nothing to fuse")
