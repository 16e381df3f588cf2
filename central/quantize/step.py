"""The push pipeline's quantization step: INT8 artifact, accuracy guard, served choice.

Edges get INT8 by default because it is ~4x smaller and faster; the guard makes sure
that choice never silently costs accuracy. When INT8 disagrees with FP32 on
held-out calibration samples (or generated ones, without a calibration file) more
than the threshold allows, the push is refused with a message that says by how much
and what to do, unless the operator asked for ``keep_fp32``: then FP32 is served and
the INT8 artifact is still stored, so the decision can be revisited."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize.calibration import Samples, batch_size, generated_samples, load_calibration, split
from central.quantize.guard import GUARD_BATCH, Agreement, measure_agreement
from central.quantize.quantizer import QuantizationError, QuantizationResult, quantize
from central.registry.pipeline import PushContext, report_progress
from central.registry.validate import signature
from central.settings import QuantizeSettings
from fleetwire.manifest import TensorSpec


class QuantizeStep:
    """Adds the "int8" artifact and chooses the served one (see the module docstring)."""

    name = "quantize"

    def __init__(self, settings: QuantizeSettings | None = None) -> None:
        self.settings = settings or QuantizeSettings()

    def run(self, ctx: PushContext) -> None:
        """Quantize, measure, decide; raise ``AccuracyGuardFailed``/``QuantizationFailed`` to refuse."""
        ctx.artifacts.setdefault("fp32", ctx.upload)
        if not self.settings.enabled:
            return
        if not ctx.inputs or not ctx.outputs:
            ctx.inputs, ctx.outputs = signature(onnx.load(str(ctx.upload), load_external_data=False))
        calibration, held_out, report = self._samples(ctx)
        out = _work_dir(ctx) / "int8.onnx"
        size, fixed = _batching(ctx.inputs)
        scratch = out.parent / "quantize"
        try:
            result = quantize(
                ctx.upload, out, calibration=calibration, work_dir=scratch, batch_size=size, fixed_batch=fixed
            )
        except QuantizationError as exc:
            self._failed(ctx, report, exc)
            return
        started = time.perf_counter()
        guard_batch = size if fixed else GUARD_BATCH
        report_progress("guard", "start")
        agreement = measure_agreement(ctx.upload, out, held_out, ctx.outputs, batch_size=guard_batch, fixed_batch=fixed)
        report_progress("guard", "end")
        report["guard_seconds"] = round(time.perf_counter() - started, 4)
        report.update(_result_fields(result, agreement, self.settings.threshold))
        ctx.artifacts["int8"] = out
        self._decide(ctx, report, agreement)

    def _samples(self, ctx: PushContext) -> tuple[Samples | None, Samples, dict[str, Any]]:
        """(calibration part or None, guard samples, report so far)."""
        if ctx.calibration is None:
            size, fixed = _batching(ctx.inputs)
            whole = size if fixed else 1  # a fixed batch dimension takes whole batches only
            n = -(-self.settings.generated_samples // whole) * whole
            samples = generated_samples(ctx.inputs, n, self.settings.seed)
            return None, samples, {"samples_source": "generated", "calibration_samples": 0}
        data = load_calibration(ctx.calibration, ctx.inputs)
        calibration, held_out = split(data)
        count = next(iter(calibration.values())).shape[0]
        report = {"samples_source": "held-out", "calibration_samples": int(count), "calibration_ignored": data.ignored}
        return calibration, held_out, report

    def _decide(self, ctx: PushContext, report: dict[str, Any], agreement: Agreement) -> None:
        """Serve INT8 if it passes; else FP32 when asked for, else refuse (``served`` None)."""
        passed = agreement.agreement >= self.settings.threshold
        reason = None if passed else _guard_message(report, agreement)
        self._serve(ctx, report, "int8" if passed else "fp32", reason)
        if reason is not None and not ctx.keep_fp32:
            raise AccuracyGuardFailed(f"{reason}; push with keep_fp32 to serve FP32")

    def _failed(self, ctx: PushContext, report: dict[str, Any], exc: QuantizationError) -> None:
        """No INT8 model at all: FP32 when asked for, else refuse."""
        report["threshold"] = self.settings.threshold
        self._serve(ctx, report, "fp32", f"quantization failed: {exc}")
        if not ctx.keep_fp32:
            raise QuantizationFailed(f"INT8 quantization failed: {exc}; push with keep_fp32 to serve FP32")

    @staticmethod
    def _serve(ctx: PushContext, report: dict[str, Any], artifact: str, reason: str | None) -> None:
        """Record the choice; a fallback to FP32 the operator did not ask for is a refusal."""
        refused = artifact == "fp32" and not ctx.keep_fp32
        report["served"] = None if refused else artifact
        report["served_reason"] = reason
        _publish(ctx, report)
        if not refused:
            ctx.served_artifact = artifact


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


def _result_fields(result: QuantizationResult, agreement: Agreement, threshold: float) -> dict[str, Any]:
    """The report entries that come from the quantizer and the guard."""
    return {
        "method": result.method,
        "per_channel": result.per_channel,
        "per_channel_fallback_reason": result.per_channel_fallback_reason,
        "preprocess": result.preprocess,
        "preprocess_note": result.preprocess_note,
        "fp32_bytes": result.fp32_bytes,
        "int8_bytes": result.int8_bytes,
        "size_ratio": round(result.int8_bytes / result.fp32_bytes, 4) if result.fp32_bytes else None,
        "agreement": agreement.agreement,
        "metric": agreement.metric,
        "samples": agreement.samples,
        "detail": agreement.detail,
        "threshold": threshold,
        "seconds": result.seconds,
    }


def _guard_message(report: dict[str, Any], agreement: Agreement) -> str:
    """E.g. "INT8 agreement 97.3% is below the 99.0% threshold (top-1 on 90 held-out samples)"."""
    metric = "top-1" if agreement.metric == "top1" else "1 - relative error"
    return (
        f"INT8 agreement {agreement.agreement:.1%} is below the {report['threshold']:.1%} threshold "
        f"({metric} on {agreement.samples} {report['samples_source']} samples)"
    )


def _publish(ctx: PushContext, report: dict[str, Any]) -> None:
    """The same dict on the context (for the manifest) and in the push report."""
    ctx.quantization = report
    ctx.report["quantization"] = report
