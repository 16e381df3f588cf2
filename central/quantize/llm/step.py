"""The quantize and guard steps of a language-model push (``kind`` decoder).

``TextQuantizeStep`` makes one weight-only candidate per recipe (``int4-b32``,
``int4-b128``, ``int8-wo``: ``central.quantize.llm.weight_only``), each an artifact
carrying the push's companion files like the reference. ``TextGuardStep`` runs the
reference and every candidate on held-out text (``central.quantize.llm.text``) and judges
each (``central.quantize.llm.guard``).

What is served: every candidate that passes travels as an alternative (the reference
always), so an edge can time decode tokens/s on its own CPU and serve the fastest; the
default, for an edge that has not timed them, is the **smallest** passing candidate
(4-bit before 8-bit: decode reads every weight once per token, so fewer bytes is faster
on any CPU); when none passes, the reference (int4 → int8 → reference). The report says,
per candidate, which measure decided."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from central.errors import AccuracyGuardFailed
from central.quantize.llm.guard import TextRun, TextVerdict, judge_text, run_text
from central.quantize.llm.text import TextWindows, held_out_text, token_windows
from central.quantize.llm.weight_only import TEXT_RECIPES, TextRecipe, WeightOnlyResult, quantize_weights
from central.quantize.quantizer import model_bytes, shorten
from central.quantize.report import FP32_HINT, refuses
from central.quantize.verdict import z_score
from central.registry.decoder import TOKENIZER, DecoderSpec
from central.registry.pipeline import PushContext
from central.settings import QuantizeSettings
from fleetwire.manifest import MODEL_FILE


@dataclass
class TextPlan:
    """What the quantize step hands the guard step for a language model."""

    spec: DecoderSpec
    reference_bytes: int
    candidates: dict[str, tuple[TextRecipe, WeightOnlyResult]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    verdicts: dict[str, TextVerdict] = field(default_factory=dict)
    quantize_seconds: float = 0.0
    guard: dict[str, Any] = field(default_factory=dict)


class TextQuantizeStep:
    """Weight-only candidates of a language model (see the module docstring)."""

    name = "quantize"

    def __init__(self, settings: QuantizeSettings | None = None) -> None:
        self.settings = settings or QuantizeSettings()

    def run(self, ctx: PushContext) -> None:
        """One candidate per configured recipe; a recipe that fails is reported, not fatal."""
        ctx.artifacts.setdefault("fp32", ctx.upload)
        spec = ctx.decoder
        if not self.settings.enabled or spec is None:
            return
        plan = TextPlan(spec, model_bytes(ctx.upload))
        ctx.quantize_plan = plan
        if spec.num_kv_heads is None or spec.head_size is None:
            plan.failed["all"] = "the KV cache's head count or head size is stated by neither the graph nor a config"
            return
        started = time.perf_counter()
        assert ctx.work_dir is not None, "the registry gives every push a work directory"
        for name in self.settings.text.recipes:
            self._quantize(ctx, plan, TEXT_RECIPES[name], ctx.work_dir / name / MODEL_FILE)
        plan.quantize_seconds = round(time.perf_counter() - started, 4)

    def _quantize(self, ctx: PushContext, plan: TextPlan, recipe: TextRecipe, out: Path) -> None:
        try:
            result = quantize_weights(
                ctx.upload, out, recipe, accuracy_level=self.settings.text.accuracy_level,
                external_data_bytes=self.settings.external_data_bytes,
            )  # fmt: skip
        except Exception as exc:  # anything from ORT's quantizer is a failed recipe
            plan.failed[recipe.name] = shorten(exc)
            return
        plan.candidates[recipe.name] = (recipe, result)
        ctx.artifacts[recipe.name] = result.path


class TextGuardStep:
    """Judges a language model's candidates on held-out text; chooses what is served."""

    name = "guard"

    def __init__(self, settings: QuantizeSettings | None = None) -> None:
        self.settings = settings or QuantizeSettings()

    def run(self, ctx: PushContext) -> None:
        """Measure every candidate, decide, report; ``AccuracyGuardFailed`` only when the
        operator required a quantized artifact (``--require-int8``) and none passed."""
        plan = ctx.quantize_plan
        if not isinstance(plan, TextPlan):
            return
        if plan.candidates:
            self._measure(ctx, plan)
        _decide(ctx, plan, self.settings)

    def _measure(self, ctx: PushContext, plan: TextPlan) -> None:
        s = self.settings.text
        started = time.perf_counter()
        window = min(s.window_tokens, plan.spec.context_length or s.window_tokens)
        text, source = held_out_text(ctx.eval_data, ctx.calibration)
        windows = token_windows(ctx.upload.parent / TOKENIZER, text, source, window, s.max_windows)
        reference = run_text(ctx.upload, plan.spec, windows)
        threshold = s.min_greedy_agreement if ctx.threshold is None else ctx.threshold
        z = z_score(self.settings.confidence)
        for name, (_, result) in plan.candidates.items():
            candidate = run_text(result.path, plan.spec, windows)
            plan.verdicts[name] = judge_text(
                reference, candidate, z=z, max_ratio=s.max_perplexity_ratio, min_agreement=threshold
            )
        plan.guard = _guard_report(windows, reference, round(time.perf_counter() - started, 4))


def _guard_report(windows: TextWindows, reference: TextRun, seconds: float) -> dict[str, Any]:
    return {
        "samples_source": windows.source,
        "text_characters": windows.characters,
        "windows": int(windows.ids.shape[0]),
        "window_tokens": int(windows.ids.shape[1]),
        "tokens": windows.predictions,
        "reference_seconds": reference.seconds,
        "guard_seconds": seconds,
    }


def _candidate_report(plan: TextPlan, name: str, confidence: float) -> dict[str, Any]:
    recipe, result = plan.candidates[name]
    report: dict[str, Any] = {
        **recipe.describe(),
        "family": "decoder",
        "fp32_bytes": plan.reference_bytes,
        "bytes": result.bytes,
        "size_ratio": round(result.bytes / plan.reference_bytes, 4) if plan.reference_bytes else None,
        "quantized_nodes": result.quantized_nodes,
        "seconds": result.seconds,
    }
    verdict = plan.verdicts.get(name)
    if verdict is not None:
        report["text_guard"] = verdict.report(plan.guard.get("samples_source", ""), confidence)
    return report


def _reason(plan: TextPlan) -> str:
    """Why the reference is served."""
    if not plan.candidates:
        failures = "; ".join(f"{n}: {why}" for n, why in plan.failed.items())
        return f"no weight-only candidate could be made ({failures or 'none configured'})"
    parts = []
    for name, v in plan.verdicts.items():
        if v.decided_by == "perplexity_ratio":
            parts.append(f"{name}: perplexity ratio upper bound {v.perplexity_upper:.4f} > {v.max_perplexity_ratio}")
        else:
            parts.append(f"{name}: greedy agreement lower bound {v.agreement_lower:.2%} < {v.min_agreement:.2%}")
    return "no candidate passed the text guard (" + "; ".join(parts) + ")"


def _decide(ctx: PushContext, plan: TextPlan, settings: QuantizeSettings) -> None:
    """Served artifact and alternatives (see the module docstring), and the push's report."""
    passed = sorted((n for n, v in plan.verdicts.items() if v.passed), key=lambda n: plan.candidates[n][1].bytes)
    ctx.artifact_reports.update({n: _candidate_report(plan, n, settings.confidence) for n in plan.candidates})
    served = passed[0] if passed else "fp32"
    reason = None if passed else _reason(plan)
    ctx.served_artifact = served
    ctx.alternatives = [n for n in passed if n != served] + (["fp32"] if passed else [])
    text = settings.text
    report: dict[str, Any] = {
        "family": "decoder",
        "method": "weight_only",
        **plan.guard,
        "confidence": settings.confidence,
        "thresholds": {
            "max_perplexity_ratio": text.max_perplexity_ratio,
            "min_greedy_agreement": text.min_greedy_agreement if ctx.threshold is None else ctx.threshold,
        },
        "fp32_bytes": plan.reference_bytes,
        "candidates": {n: ctx.artifact_reports[n] for n in plan.candidates},
        "failed_recipes": plan.failed,
        "quantize_seconds": plan.quantize_seconds,
        "served": served,
        "served_reason": reason,
        "fallback": [*(n for n in text.recipes if n in plan.candidates), "fp32"],
        "alternatives": list(ctx.alternatives),
    }
    ctx.quantization = report
    ctx.report["quantization"] = report
    if not passed and refuses(ctx):
        raise AccuracyGuardFailed(f"{reason}; {FP32_HINT}, or lower the threshold with --threshold")
