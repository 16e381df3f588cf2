"""The push pipeline's quantize step: INT8 candidates, one per recipe, each verified.

Edges get INT8 by default because it is ~4x smaller and faster, but which INT8 is
faster depends on the CPU, so this step produces a few candidates for the model's
family (``central.quantize.recipes``); the guard step that follows judges each
against FP32 and chooses what is served (``central.quantize.guard_step``). A model
below ``small_model_bytes`` gets only the recipe fastest on central's CPU: INT8
buys such a model little and pushes of it stay quick.

When a recipe fails on the graph as pushed, the step cleans what exporters leave behind
(``central.quantize.normalize``: stale ``value_info``, operators named like ORT's own),
prepares the cleaned graph and tries every recipe again on it, so that all candidates
come from one graph; the report's ``normalized`` says what was changed and why."""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import onnx

from central.quantize.calibration import batch_size
from central.quantize.cpu import cpu_flags
from central.quantize.family import Family, detect_family, sensitive_nodes
from central.quantize.guard import GUARD_BATCH
from central.quantize.normalize import Normalization, normalize
from central.quantize.plan import Int8Candidate, QuantizePlan
from central.quantize.quantizer import (
    Calibration,
    QuantizationError,
    model_bytes,
    prepare,
    quantize_recipe,
    shorten,
)
from central.quantize.recipes import Recipe, candidates
from central.quantize.report import publish, quantization_failed
from central.quantize.samples import Generation, push_samples
from central.quantize.synthetic import (
    InputHints,
    Sizes,
    check_dims,
    input_hints,
    sample_shape,
)
from central.quantize.verdict import samples_needed, z_score
from central.registry.pipeline import PushContext
from central.registry.validate import signature
from central.settings import QuantizeSettings
from fleetwire.manifest import MODEL_FILE, TensorSpec

#: Generated guard samples never exceed this, whatever a threshold near 1 would need.
MAX_GENERATED_SAMPLES = 4096


def _batching(inputs: list[TensorSpec]) -> tuple[int, bool]:
    """(calibration batch size, whether the model's batch dimension is fixed)."""
    fixed = batch_size(inputs, 0)
    return (fixed, True) if fixed > 0 else (batch_size(inputs), False)


def _work_dir(ctx: PushContext) -> Path:
    """The push's scratch directory; one is created (and recorded on ``ctx``, whose
    owner removes it with the push) when the pipeline did not provide one."""
    if ctx.work_dir is None:
        ctx.work_dir = Path(tempfile.mkdtemp(prefix="modelfleet-push-"))
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return ctx.work_dir


class QuantizeStep:
    """Adds one artifact per INT8 recipe (see the module docstring)."""

    name = "quantize"

    def __init__(self, settings: QuantizeSettings | None = None) -> None:
        self.settings = settings or QuantizeSettings()

    def run(self, ctx: PushContext) -> None:
        """Plan, prepare, quantize; ``QuantizationFailed`` when no recipe gives a model and
        the operator required INT8 (else FP32 is served)."""
        ctx.artifacts.setdefault("fp32", ctx.upload)
        if not self.settings.enabled:
            return
        if not ctx.inputs or not ctx.outputs:
            ctx.inputs, ctx.outputs = signature(onnx.load(str(ctx.upload), load_external_data=False))
        started = time.perf_counter()
        plan, recipes = self._plan(ctx)
        for recipe in recipes:
            self._quantize(ctx, plan, recipe)
        if plan.failed:
            self._retry_normalized(ctx, plan, recipes)
        plan.quantize_seconds = round(time.perf_counter() - started, 4)
        ctx.quantize_plan = plan
        if plan.candidates:
            publish(ctx, plan)
        else:
            quantization_failed(ctx, plan)  # serves FP32, or refuses when the operator required INT8

    def _recipes(self, ctx: PushContext, family: Family, flags: frozenset[str]) -> list[Recipe]:
        """This push's recipes: the family's, one for a small model."""
        s = self.settings
        small = model_bytes(ctx.upload) < s.small_model_bytes
        calibrated = ctx.calibration is not None or family == "cnn"
        limit = 1 if small else s.max_candidates
        return candidates(family, calibrated=calibrated, configured=s.recipes, limit=limit, flags=flags)

    def _plan(self, ctx: PushContext) -> tuple[QuantizePlan, list[Recipe]]:
        """Family, recipes, samples and the prepared source of this push."""
        s = self.settings
        model = onnx.load(str(ctx.upload), load_external_data=False)
        family, hints = detect_family(model), input_hints(model)
        del model
        check_dims(ctx.dims, hints)
        flags = frozenset(s.cpu_flags) if s.cpu_flags is not None else cpu_flags()
        recipes = self._recipes(ctx, family, flags)
        static = any(r.method == "static" for r in recipes)
        size, fixed = _batching(ctx.inputs)
        samples = push_samples(
            ctx.inputs, hints, self._generation(ctx), calibration=ctx.calibration, eval_data=ctx.eval_data,
            static=static, generate_calibration=family == "cnn", fixed_batch=size if fixed else 0,
        )  # fmt: skip
        generated = samples.source == "generated" or samples.report.get("calibration_source") == "generated"
        samples.report["generated_shapes"] = _generated_dims(ctx.inputs, hints, self._sizes(ctx)) if generated else None
        source = prepare(ctx.upload, _work_dir(ctx) / "quantize", family, s.external_data_bytes)
        sensitive = sensitive_nodes(onnx.load(str(source.path), load_external_data=False), family)
        cache = source.path.parent / "calibration-ranges.json"
        cache.unlink(missing_ok=True)  # ranges are this push's model's and samples' only
        calibration = Calibration(samples.calibration, size, fixed, cache) if samples.calibration is not None else None
        plan = QuantizePlan(
            family, source, samples, calibration, sensitive, self._threshold(ctx), s.confidence, flags,
            batch_size=size if fixed else GUARD_BATCH, fixed_batch=fixed,
        )  # fmt: skip
        return plan, recipes

    def _retry_normalized(self, ctx: PushContext, plan: QuantizePlan, recipes: list[Recipe]) -> None:
        """Every recipe again on the exporter-cleaned graph; nothing when there is nothing to clean."""
        cleaned = self._cleaned(ctx, plan)
        if cleaned is None:
            return
        as_pushed = dict(plan.failed)
        self._retarget(ctx, plan, cleaned)
        for recipe in recipes:
            self._quantize(ctx, plan, recipe)
        for name, why in plan.failed.items():
            plan.failed[name] = f"as pushed: {as_pushed.get(name, 'quantized')}; normalized: {why}"
        plan.normalized = {**cleaned.report(), "as_pushed_failures": as_pushed}

    @staticmethod
    def _cleaned(ctx: PushContext, plan: QuantizePlan) -> Normalization | None:
        """The upload cleaned (``central.quantize.normalize``); None when nothing changed."""
        out = _work_dir(ctx) / "normalize" / "normalized.onnx"
        try:
            cleaned = normalize(ctx.upload, out, external_data=plan.source.external_data)
        except Exception as exc:  # a graph the cleaning cannot read: the failures as pushed stand
            plan.normalized = {"changes": [], "error": shorten(exc)}
            return None
        return cleaned if cleaned.changes else None

    def _retarget(self, ctx: PushContext, plan: QuantizePlan, cleaned: Normalization) -> None:
        """The plan's source becomes the cleaned graph, prepared; earlier candidates are dropped."""
        work = cleaned.path.parent
        source = prepare(cleaned.path, work / "prepare", plan.family, self.settings.external_data_bytes)
        plan.source = replace(source, keep_fp32=tuple(cleaned.keep_fp32))
        plan.sensitive = sensitive_nodes(onnx.load(str(source.path), load_external_data=False), plan.family)
        if plan.calibration is not None:
            plan.calibration = replace(plan.calibration, cache=work / "calibration-ranges.json")
        for name in plan.candidates:
            ctx.artifacts.pop(name, None)
        plan.candidates.clear()
        plan.failed.clear()

    def _threshold(self, ctx: PushContext) -> float:
        return self.settings.threshold if ctx.threshold is None else ctx.threshold

    def _sizes(self, ctx: PushContext) -> Sizes:
        return Sizes(dict(ctx.dims), self.settings.sequence_length, self.settings.image_size)

    def _generation(self, ctx: PushContext) -> Generation:
        s = self.settings
        needed = min(samples_needed(self._threshold(ctx), z_score(s.confidence)), MAX_GENERATED_SAMPLES)
        return Generation(
            samples=max(s.generated_samples, needed), max_elements=s.generated_max_elements, min_samples=needed,
            calibration_samples=s.generated_calibration_samples, seed=s.seed, sizes=self._sizes(ctx),
        )  # fmt: skip

    @staticmethod
    def _quantize(ctx: PushContext, plan: QuantizePlan, recipe: Recipe) -> None:
        """One candidate, verified, or the reason it failed."""
        out = _work_dir(ctx) / recipe.name / MODEL_FILE
        try:
            result = quantize_recipe(plan.source, ctx.upload, out, recipe, calibration=plan.calibration)
        except QuantizationError as exc:
            plan.failed[recipe.name] = str(exc)
            return
        except Exception as exc:  # anything else from ORT's quantizer is a failed recipe too
            plan.failed[recipe.name] = shorten(exc)
            return
        plan.candidates[recipe.name] = Int8Candidate(recipe, out, result)
        ctx.artifacts[recipe.name] = out


def _generated_dims(inputs: list[TensorSpec], hints: InputHints, sizes: Sizes) -> dict[str, list[int]]:
    """Shape of one generated sample per input, for the report (what ``--dim`` changes)."""
    return {spec.name: list(sample_shape(spec, 1, hints, sizes)[1:]) for spec in inputs}
