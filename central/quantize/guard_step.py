"""The push pipeline's guard step: judge every INT8 candidate, choose what is served.

Each candidate runs on the guard's samples next to FP32 (``central.quantize.guard``)
and passes when every measure's lower confidence bound reaches the threshold
(``central.quantize.verdict``). One that fails with the whole graph in INT8 is
quantized once more with the sensitive nodes kept in FP32 (first and last layers,
Softmax, normalisations; ``central.quantize.family``) and judged again.

Every candidate that passes travels in the manifest (``ctx.alternatives``, FP32
always), so each edge can time them on its own CPU; the default, for an edge of
unknown hardware, is the one fastest on central's CPU flags. When none passes,
FP32 is served and the candidates are still stored, so the decision can be
revisited; an unproven one travels as ``pending`` and is promoted on live evidence
(``central.rollout.promotion``); the report's ``int8`` says why (``unproven``: too few samples to prove a
candidate that agreed; ``refused``: INT8 measurably disagreed). The push is refused
(422) instead only when the operator required INT8 (``--require-int8``)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from central.errors import AccuracyGuardFailed
from central.quantize.guard import accuracy, compare, run_outputs
from central.quantize.plan import Int8Candidate, QuantizePlan
from central.quantize.quantizer import quantize_recipe
from central.quantize.recipes import by_preference
from central.quantize.report import FP32_HINT, guard_message, publish, refuses, unproven_candidates
from central.quantize.verdict import GuardVerdict, judge, z_score
from central.registry.pipeline import PushContext

#: Folder suffix of a candidate re-made with its sensitive nodes in FP32.
_RETRY_SUFFIX = "-fp32-sensitive"


class GuardStep:
    """Judges the quantize step's candidates (see the module docstring)."""

    name = "guard"

    def run(self, ctx: PushContext) -> None:
        """Measure, retry, decide; ``AccuracyGuardFailed`` when nothing passes."""
        plan = ctx.quantize_plan
        if not isinstance(plan, QuantizePlan) or not plan.candidates:
            return
        started = time.perf_counter()
        names = [spec.name for spec in ctx.outputs]
        samples = plan.samples.guard
        reference = run_outputs(ctx.upload, samples, names, plan.batch_size, plan.fixed_batch)
        if plan.samples.labels is not None:
            plan.accuracies["fp32"] = accuracy(ctx.outputs, reference, plan.samples.labels)
        for name in list(plan.candidates):
            self._judge(ctx, plan, name, reference)
        plan.guard_seconds = round(time.perf_counter() - started, 4)
        _decide(ctx, plan)

    def _judge(self, ctx: PushContext, plan: QuantizePlan, name: str, reference: list[np.ndarray]) -> None:
        """The candidate's verdict; on failure, a retry with sensitive nodes in FP32."""
        candidate = plan.candidates[name]
        verdict = _verdict(ctx, plan, candidate, reference)
        if verdict.passed or not plan.sensitive or candidate.result.nodes_excluded:
            plan.verdicts[name] = verdict
            return
        retry = _retry(ctx, plan, candidate)
        retried = _verdict(ctx, plan, retry, reference) if retry is not None else None
        if retry is None or retried is None or _margin(retried) <= _margin(verdict):
            plan.verdicts[name] = verdict
            return
        plan.candidates[name] = retry
        plan.verdicts[name] = retried
        ctx.artifacts[name] = retry.path


def _margin(verdict: GuardVerdict) -> float:
    return verdict.decided_by.lower_bound - verdict.threshold


def _verdict(
    ctx: PushContext, plan: QuantizePlan, candidate: Int8Candidate, reference: list[np.ndarray]
) -> GuardVerdict:
    """Run the candidate on the guard's samples and judge it against ``reference``."""
    names = [spec.name for spec in ctx.outputs]
    got = run_outputs(candidate.path, plan.samples.guard, names, plan.batch_size, plan.fixed_batch)
    if plan.samples.labels is not None:
        plan.accuracies[candidate.recipe.name] = accuracy(ctx.outputs, got, plan.samples.labels)
    generated = plan.samples.source == "generated"
    z = z_score(plan.confidence)
    return judge(compare(ctx.outputs, reference, got, z, generated=generated, threshold=plan.threshold), plan.threshold)


def _retry(ctx: PushContext, plan: QuantizePlan, candidate: Int8Candidate) -> Int8Candidate | None:
    """The candidate re-made with the sensitive nodes in FP32, or None if that fails."""
    out = candidate.path.parent.with_name(candidate.path.parent.name + _RETRY_SUFFIX) / candidate.path.name
    try:
        result = quantize_recipe(
            plan.source, ctx.upload, out, candidate.recipe, calibration=plan.calibration, exclude=plan.sensitive
        )
    except Exception:  # a failed retry leaves the first verdict standing
        return None
    return replace(candidate, path=out, result=result)


def _pending_order(entry: dict[str, object]) -> float:
    """Pending candidates best first: the highest lower bound of the deciding measure."""
    bound = entry.get("lower_bound")
    return -float(bound) if isinstance(bound, int | float) else 0.0


def _decide(ctx: PushContext, plan: QuantizePlan) -> None:
    """Served artifact and alternatives from the verdicts; refuse when none passed."""
    passed = [n for n in plan.candidates if plan.verdicts[n].passed]
    if passed:
        served = by_preference(passed, plan.flags, plan.family)[0]
        ctx.served_artifact = served
        ctx.alternatives = [n for n in passed if n != served] + ["fp32"]
        publish(ctx, plan, served, None)
        return
    reason = guard_message(plan)
    ctx.served_artifact = "fp32"
    ctx.alternatives = []
    ctx.pending = [entry["artifact"] for entry in sorted(unproven_candidates(plan), key=_pending_order)]
    publish(ctx, plan, None if refuses(ctx) else "fp32", reason)
    if refuses(ctx):
        raise AccuracyGuardFailed(f"{reason}; {FP32_HINT}, or lower the threshold with --threshold")
