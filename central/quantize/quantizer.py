"""FP32 → INT8 with onnxruntime's quantization tools, one recipe at a time.

Choices, and why:

* **One prepared source per push, shared by every recipe.** CNNs and MLPs go
  through ``quant_pre_process`` (ORT basic optimisation, which folds BatchNorm into
  Conv and fuses MatMul+Add into Gemm, plus shape inference), because the quantizer
  can only quantize tensors whose shapes it knows. Symbolic shape inference needs
  sympy and fails on some graphs, so it is tried, then skipped, then the raw model
  is used; the report says which. Transformers go through ONNX Runtime's
  transformer optimizer instead (``central.quantize.transformer``).
* **The recipe** (``central.quantize.recipes``) sets format, types and
  ``reduce_range``. Static recipes calibrate with **MinMax, asymmetric
  activations, symmetric weights.** Measured on the digits MLP over four training
  seeds: MinMax, Entropy and Percentile all kept held-out top-1 agreement at 100 %;
  ``ActivationSymmetric`` was worse, as expected after ReLU; the histogram methods
  cost more memory and, in ORT 1.31, fail when the last batch is smaller.
* **Per-channel first, per-tensor on failure.** ORT 1.31's QDQ quantizer raises
  ``ValueError: The truth value of an array ... is ambiguous`` in
  ``_adjust_weight_scale_for_int32_bias`` on skl2onnx MLPs (non-zero Gemm bias with
  per-channel weight scales); the retry is per-tensor and the reason is recorded.
* **Exclusions** (``nodes_to_exclude``) keep named nodes in FP32: the step's
  second try when the whole graph in INT8 fails the guard.
* **Exporters' leftovers** (stale ``value_info``, operators named like ORT's own) are
  cleaned by ``central.quantize.normalize`` when a recipe fails on the graph as pushed;
  the quantize step then prepares the cleaned graph and tries every recipe again.
* **External data** when the model is large (ONNX protobufs stop at 2 GiB): the
  result is written as ``model.onnx`` plus ``model.onnx.data`` in its own folder.

Every result is checked with ``onnx.checker`` and an onnxruntime CPU session before
it counts: a quantized model that does not load is treated like one that failed."""

from __future__ import annotations

import importlib.util
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from central.quantize.calibration import DEFAULT_BATCH, SamplesReader
from central.quantize.family import Family, name_nodes
from central.quantize.recipes import DYNAMIC, RECIPES, S8S8_QDQ, Recipe
from central.quantize.transformer import optimize_transformer

#: Explicit although they are ORT's defaults: the docstring above says why these.
STATIC_EXTRA_OPTIONS: dict[str, object] = {"ActivationSymmetric": False, "WeightSymmetric": True}
#: ``DefaultTensorType``: after the transformer optimizer, ONNX shape inference cannot
#: type the outputs of com.microsoft ops; they are float, which is what ORT needs told.
DYNAMIC_EXTRA_OPTIONS: dict[str, object] = {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT}
#: Above this many bytes a model is read and written as graph + external data.
EXTERNAL_DATA_BYTES = 1536 * 1024 * 1024
_REASON_CHARS = 200
_TYPES = {"U8": QuantType.QUInt8, "S8": QuantType.QInt8}
_FORMATS = {"QDQ": QuantFormat.QDQ, "QOperator": QuantFormat.QOperator}


class QuantizationError(RuntimeError):
    """Neither per-channel nor per-tensor quantization gave a loadable model."""


@dataclass(frozen=True)
class Source:
    """The model every recipe of a push quantizes: FP32, prepared once."""

    path: Path
    #: "full", "no_symbolic_shape", "raw" (pre-processing failed) or "transformer".
    preprocess: str
    preprocess_note: str | None = None
    #: The transformer optimizer's fused operators ({} when it was not used).
    fused: dict[str, int] = field(default_factory=dict)
    #: Write results as graph + external data.
    external_data: bool = False
    #: Nodes every recipe leaves in FP32 whatever it is asked to exclude: those the
    #: quantizer would break (``central.quantize.normalize``); not reported as exclusions.
    keep_fp32: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuantizationResult:
    """What quantizing with one recipe did, for the push report."""

    method: Literal["static", "dynamic"]
    per_channel: bool
    #: Why per-channel was abandoned (the exception, shortened); None if it worked.
    per_channel_fallback_reason: str | None
    fp32_bytes: int
    int8_bytes: int
    seconds: float
    preprocess: str = "full"
    preprocess_note: str | None = None
    recipe: str = S8S8_QDQ
    nodes_excluded: list[str] = field(default_factory=list)


def shorten(exc: BaseException) -> str:
    """``Type: first line of the message``, cut to a report-friendly length."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def model_bytes(path: Path) -> int:
    """The graph file plus the external-data files next to it that it names."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: its size is the file's (the quantizer will say what is wrong)
        return path.stat().st_size
    names = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    return path.stat().st_size + sum((path.parent / n).stat().st_size for n in names if (path.parent / n).is_file())


def _preprocess_attempts() -> list[tuple[str, dict[str, bool]]]:
    """Full pre-processing only when sympy (symbolic shape inference) is importable."""
    attempts = [("no_symbolic_shape", {"skip_symbolic_shape": True})]
    if importlib.util.find_spec("sympy") is not None:
        attempts.insert(0, ("full", {}))
    return attempts


def preprocess(fp32: Path, dst: Path, external_data: bool = False) -> tuple[Path, str, str | None]:
    """(model to quantize, mode, note): the pre-processed model, or ``fp32`` if all failed."""
    notes = [] if importlib.util.find_spec("sympy") else ["symbolic shape inference skipped: sympy not installed"]
    data = {
        "save_as_external_data": True,
        "all_tensors_to_one_file": True,
        "external_data_location": dst.name + ".data",
    }
    for mode, options in _preprocess_attempts():
        try:
            quant_pre_process(str(fp32), str(dst), **options, **(data if external_data else {}))
            return dst, mode, "; ".join(notes) or None
        except Exception as exc:  # ORT raises anything from shape inference; fall through
            notes.append(f"{mode} failed: {shorten(exc)}")
    return fp32, "raw", "; ".join(notes)


def _named(source: Path, work_dir: Path, external_data: bool) -> Path:
    """``source``, or a copy whose nodes all have names (exclusions go by name)."""
    try:
        model = onnx.load(str(source))
    except Exception:  # not a model at all: the quantizer reports it, with its own words
        return source
    if not name_nodes(model):
        return source
    out = work_dir / "named.onnx"
    onnx.save(model, str(out), save_as_external_data=external_data, location=out.name + ".data")
    return out


def prepare(fp32: Path, work_dir: Path, family: Family, external_data_bytes: int = EXTERNAL_DATA_BYTES) -> Source:
    """The push's ``Source``: optimised for transformers, pre-processed otherwise; results
    are written with external data when the model exceeds ``external_data_bytes``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    large = model_bytes(fp32) > external_data_bytes
    if family == "transformer":
        optimized = optimize_transformer(fp32, work_dir / "optimized.onnx", external_data=large)
        if optimized.path != fp32:
            return Source(optimized.path, "transformer", optimized.note, optimized.fused, large)
        note = optimized.note
    else:
        note = None
    path, mode, pre_note = preprocess(fp32, work_dir / "preprocessed.onnx", large)
    notes = "; ".join(n for n in (note, pre_note) if n) or None
    return Source(_named(path, work_dir, large), mode, notes, external_data=large)


def verify(path: Path) -> None:
    """Raise unless ``path`` passes ``onnx.checker`` and loads in an ORT CPU session."""
    onnx.checker.check_model(str(path))
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _with_fallback(attempt: Callable[[bool], None], out: Path, first: bool = True) -> tuple[bool, str | None]:
    """(per_channel, fallback reason): per-channel if it works and verifies, else per-tensor."""
    reason = "per-channel not asked for"
    if first:
        try:
            attempt(True)
            verify(out)
            return True, None
        except Exception as exc:  # the quantizer raises ValueError, KeyError, AssertionError...
            reason = shorten(exc)
    try:
        attempt(False)
        verify(out)
    except Exception as exc:
        _remove(out)
        raise QuantizationError(f"per-channel failed ({reason}); per-tensor failed too ({shorten(exc)})") from exc
    return False, reason


def _remove(out: Path) -> None:
    out.unlink(missing_ok=True)
    Path(f"{out}.data").unlink(missing_ok=True)


@dataclass(frozen=True)
class Calibration:
    """Calibration samples and how to batch them (a fixed batch dimension takes whole batches).

    ``cache``: where ORT (1.31+) keeps the tensor ranges it measured, so the second
    static recipe of a push (and every per-tensor retry) skips calibration: the
    ranges depend on the model and the samples, not on the recipe."""

    samples: dict[str, np.ndarray]
    batch_size: int = DEFAULT_BATCH
    fixed_batch: bool = False
    cache: Path | None = None


#: ORT 1.31 added ``calibration_cache_path``; older versions calibrate every time.
_HAS_CALIBRATION_CACHE = "calibration_cache_path" in inspect.signature(quantize_static).parameters


def _attempt(
    source: Source, out: Path, recipe: Recipe, calibration: Calibration | None, exclude: list[str]
) -> Callable[[bool], None]:
    """One quantizer call for ``recipe``, parameterised by per-channel."""
    excluded = [*exclude, *source.keep_fp32]
    common: dict[str, Any] = {"nodes_to_exclude": excluded, "use_external_data_format": source.external_data}
    if recipe.method == "dynamic":
        return lambda per_channel: quantize_dynamic(
            str(source.path), str(out), per_channel=per_channel, reduce_range=recipe.reduce_range,
            weight_type=_TYPES[recipe.weight_type], extra_options=dict(DYNAMIC_EXTRA_OPTIONS), **common,
        )  # fmt: skip
    if calibration is None:
        raise QuantizationError(f"recipe {recipe.name} is static and needs calibration samples")
    data = calibration
    if _HAS_CALIBRATION_CACHE and data.cache is not None:
        common["calibration_cache_path"] = str(data.cache)

    def attempt(per_channel: bool) -> None:
        quantize_static(
            str(source.path), str(out), SamplesReader(data.samples, data.batch_size, fixed_batch=data.fixed_batch),
            quant_format=_FORMATS[recipe.quant_format], activation_type=_TYPES[recipe.activation_type],
            weight_type=_TYPES[recipe.weight_type], per_channel=per_channel, reduce_range=recipe.reduce_range,
            calibrate_method=CalibrationMethod.MinMax, extra_options=dict(STATIC_EXTRA_OPTIONS), **common,
        )  # fmt: skip

    return attempt


def quantize_recipe(
    source: Source, fp32: Path, out: Path, recipe: Recipe, *,
    calibration: Calibration | None, exclude: list[str] | None = None,
) -> QuantizationResult:  # fmt: skip
    """Write ``recipe``'s INT8 form of ``source`` to ``out`` (verified); ``QuantizationError``."""
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    excluded = list(exclude or [])
    attempt = _attempt(source, out, recipe, calibration, excluded)
    per_channel, reason = _with_fallback(attempt, out, first=recipe.per_channel)
    return QuantizationResult(
        method=recipe.method,
        per_channel=per_channel,
        per_channel_fallback_reason=reason,
        fp32_bytes=model_bytes(fp32),
        int8_bytes=model_bytes(out),
        seconds=round(time.perf_counter() - started, 4),
        preprocess=source.preprocess,
        preprocess_note=source.preprocess_note,
        recipe=recipe.name,
        nodes_excluded=excluded,
    )


def quantize(
    fp32: Path, out: Path, *, calibration: dict[str, np.ndarray] | None, work_dir: Path,
    batch_size: int = DEFAULT_BATCH, fixed_batch: bool = False, recipe: Recipe | None = None,
) -> QuantizationResult:  # fmt: skip
    """One INT8 model of ``fp32`` at ``out``: ``recipe``, or static S8S8 QDQ with
    ``calibration`` and dynamic without (what central did before recipes; the
    benchmarks and tests of single recipes use it). Raises ``QuantizationError``."""
    chosen = recipe or RECIPES[S8S8_QDQ if calibration is not None else DYNAMIC]
    started = time.perf_counter()
    scratch = work_dir / "prepare"
    try:
        source = prepare(fp32, scratch, "mlp")
        data = Calibration(calibration, batch_size, fixed_batch) if calibration is not None else None
        result = quantize_recipe(source, fp32, out, chosen, calibration=data)
    finally:
        for leftover in scratch.glob("*"):
            leftover.unlink(missing_ok=True)
    return _with_seconds(result, time.perf_counter() - started)


def _with_seconds(result: QuantizationResult, seconds: float) -> QuantizationResult:
    """``result`` timed from the start of preparation, not only of the recipe."""
    return QuantizationResult(**{**result.__dict__, "seconds": round(seconds, 4)})
