"""The quantize and guard steps' reports, and the words of their refusals.

``ctx.artifact_reports[name]``: per INT8 artifact, the recipe and what the guard
measured for it (carried in its manifest entry). ``ctx.quantization`` (also the
push report's ``quantization``): the family, every candidate, which one is served
and why, and, at the top level, the served candidate's figures (or the best
candidate's when none is served), under the keys earlier reports used.

``int8`` says what became of INT8 (``int8_status``): ``served``; ``failed`` (no recipe
gave a model); ``unproven`` (a candidate agreed on the samples but too few of them to
prove the threshold: listed under ``unproven`` with its figures); ``refused`` (every
candidate measurably disagreed). Unless the operator required INT8, a version whose
INT8 is not served is stored and served as FP32, and ``reason`` says why."""

from __future__ import annotations

import math
from typing import Any

from central.errors import QuantizationFailed
from central.quantize.cpu import cpu_kind, reported_flags
from central.quantize.plan import Int8Candidate, QuantizePlan
from central.quantize.verdict import LABELS, GuardVerdict, wilson_lower_bound, z_score
from central.registry.pipeline import PushContext

#: How a refused push says what to do, naming the CLI flag and the REST field.
FP32_HINT = "push again with --fp32 (REST: keep_fp32=true) to serve FP32"
OPTIMIZER = "onnxruntime.transformers.optimizer (bert)"


def _accuracy_fields(plan: QuantizePlan, name: str) -> dict[str, Any]:
    if name not in plan.accuracies or "fp32" not in plan.accuracies:
        return {}
    fp32, int8 = plan.accuracies["fp32"], plan.accuracies[name]
    return {"fp32_accuracy": fp32, "int8_accuracy": int8, "accuracy_delta_pp": round((fp32 - int8) * 100, 4)}


def artifact_report(plan: QuantizePlan, candidate: Int8Candidate) -> dict[str, Any]:
    """Recipe, how it went, and the guard's verdict for one INT8 artifact."""
    r = candidate.result
    fused = plan.source.fused
    report: dict[str, Any] = {
        **candidate.recipe.describe(),
        "per_channel": r.per_channel,
        "per_channel_fallback_reason": r.per_channel_fallback_reason,
        "nodes_excluded": r.nodes_excluded,
        "optimizer": OPTIMIZER if plan.source.preprocess == "transformer" else None,
        "fused_operators": fused or None,
        "preprocess": r.preprocess,
        "preprocess_note": r.preprocess_note,
        "normalized": plan.normalized["changes"] if plan.normalized else None,
        "family": plan.family,
        "fp32_bytes": r.fp32_bytes,
        "int8_bytes": r.int8_bytes,
        "size_ratio": round(r.int8_bytes / r.fp32_bytes, 4) if r.fp32_bytes else None,
        "seconds": r.seconds,
    }
    verdict = plan.verdicts.get(candidate.recipe.name)
    if verdict is not None:
        report["guard"] = {**verdict.report(), "samples_source": plan.samples.source, "confidence": plan.confidence}
        report.update(_accuracy_fields(plan, candidate.recipe.name))
    return report


def _margin(verdict: GuardVerdict | None) -> float:
    return -1.0 if verdict is None else verdict.decided_by.lower_bound - verdict.threshold


def best_candidate(plan: QuantizePlan) -> str | None:
    """The candidate whose deciding measure is furthest above (or least below) the threshold."""
    names = list(plan.candidates)
    return max(names, key=lambda n: _margin(plan.verdicts.get(n))) if names else None


def _top_level(plan: QuantizePlan, name: str | None) -> dict[str, Any]:
    """The figures earlier reports had at the top: one candidate's."""
    if name is None:
        return {"threshold": plan.threshold}
    report = artifact_report(plan, plan.candidates[name])
    guard = report.pop("guard", {})
    flat = {k: v for k, v in guard.items() if k not in ("passed", "samples_source", "confidence")}
    return {**report, **flat, "artifact": name, "threshold": plan.threshold}


def _unproven(verdict: GuardVerdict) -> bool:
    """Failed, yet every judged measure's point estimate reaches the threshold: more samples
    could prove it (all 16 of 16 agreeing, with a bound of 85.5 %)."""
    judged = [m for m in verdict.measures if m.gates]
    return not verdict.passed and all(m.value >= verdict.threshold for m in judged)


def unproven_candidates(plan: QuantizePlan) -> list[dict[str, Any]]:
    """The candidates the samples could not prove, with the figures that decided."""
    found = []
    for name, verdict in plan.verdicts.items():
        if name in plan.candidates and _unproven(verdict):
            d = verdict.decided_by
            found.append(
                {"artifact": name, "metric": d.name, "agreement": d.value, "lower_bound": d.lower_bound,
                 "samples": d.samples, "samples_source": plan.samples.source, "threshold": verdict.threshold}
            )  # fmt: skip
    return found


def int8_status(plan: QuantizePlan, served: str | None) -> str | None:
    """served, failed, unproven or refused (see the module docstring); None before the guard."""
    if served in plan.candidates:
        return "served"
    if not plan.candidates:
        return "failed"
    if not plan.verdicts:
        return None
    return "unproven" if unproven_candidates(plan) else "refused"


def _int8(plan: QuantizePlan, served: str | None, reason: str | None) -> dict[str, Any]:
    status = int8_status(plan, served)
    return {
        "status": status,
        "reason": None if status in ("served", None) else reason,
        "unproven": unproven_candidates(plan) if status == "unproven" else [],
        "pending": [e["artifact"] for e in unproven_candidates(plan)] if status == "unproven" else [],
    }


def publish(ctx: PushContext, plan: QuantizePlan, served: str | None = None, reason: str | None = None) -> None:
    """Write the artifact reports and the push's quantization report onto ``ctx``."""
    ctx.artifact_reports.update({n: artifact_report(plan, c) for n, c in plan.candidates.items()})
    shown = served if served in plan.candidates else best_candidate(plan)
    report: dict[str, Any] = {
        **_top_level(plan, shown),
        **plan.samples.report,
        "family": plan.family,
        "cpu_flags": reported_flags(plan.flags),
        "cpu_kind": cpu_kind(plan.flags),
        "candidates": {n: ctx.artifact_reports[n] for n in plan.candidates},
        "failed_recipes": plan.failed,
        "normalized": plan.normalized,
        "quantize_seconds": plan.quantize_seconds,
        "guard_seconds": plan.guard_seconds,
        "confidence": plan.confidence,
        "served": served,
        "served_reason": reason,
        "int8": _int8(plan, served, reason),
        "alternatives": list(ctx.alternatives),
    }
    ctx.quantization = report
    ctx.report["quantization"] = report


def _ceiling(verdict: GuardVerdict, plan: QuantizePlan) -> str:
    """A hint when the sample count alone keeps the top-1 bound below the threshold."""
    n = verdict.decided_by.samples
    best = wilson_lower_bound(n, n, z_score(plan.confidence))
    if verdict.decided_by.name != "top1" or best >= plan.threshold:
        return ""
    return (
        f"; {n} samples cannot prove more than {best:.1%} even when all agree: send more with --eval or --calibration"
    )


def percent(share: float) -> str:
    """``share`` as a percentage that never rounds up to a figure it is not: 0.97 → "97%",
    0.99999 → "99.999%", 0.98765 → "98.765%"."""
    text = f"{math.floor(round(share * 100_000, 6)) / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text}%"


def guard_message(plan: QuantizePlan) -> str:
    """E.g. "INT8 top-1 agreement 93.3% (95% lower bound 90.1%) is below the 97.0% threshold ..."."""
    name = best_candidate(plan)
    verdict = plan.verdicts[name] if name else None
    if verdict is None:
        return "no INT8 candidate was judged"
    d = verdict.decided_by
    tried = ", ".join(plan.candidates)
    return (
        f"INT8 {LABELS[d.name]} {percent(d.value)} ({plan.confidence:.0%} lower bound {percent(d.lower_bound)}) "
        f"is below the {percent(plan.threshold)} threshold on {d.samples} {plan.samples.source} samples "
        f"(best of {tried}: {name}){_ceiling(verdict, plan)}"
    )


def refuses(ctx: PushContext) -> bool:
    """Whether a push without a servable INT8 is refused: only when the operator required
    INT8 (``--require-int8``) and did not also ask for FP32."""
    return ctx.require_int8 and not ctx.keep_fp32


def quantization_failed(ctx: PushContext, plan: QuantizePlan) -> None:
    """No recipe gave a model: serve FP32, or refuse when the operator required INT8."""
    reasons = "; ".join(f"{n}: {why}" for n, why in plan.failed.items())
    ctx.served_artifact = "fp32"
    if not refuses(ctx):
        publish(ctx, plan, "fp32", f"quantization failed: {reasons}")
        return
    publish(ctx, plan, None, f"quantization failed: {reasons}")
    raise QuantizationFailed(f"INT8 quantization failed ({reasons}); {FP32_HINT}")
