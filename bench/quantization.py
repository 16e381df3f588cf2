"""Quantization benchmark: what central's INT8 artifact buys, and what it costs.

On the benchmark MLP (default width 2048, 7 hidden layers, ~117 MB FP32): file sizes
and the INT8-over-FP32 throughput speedup at batch 1 and 32. Both models run with the
same session options (ORT_ENABLE_ALL, intra-op threads = cores, CPUExecutionProvider);
each figure is the median over repeats of the mean time per run after warm-up,
the two precisions taking turns within each repeat. On the
digits classifier: FP32 and INT8 top-1 accuracy on the held-out test split. INT8 is
produced exactly as central produces it (``central.quantize``: calibration split,
static QDQ, per-channel with fallback), so the figures describe what edges get.

Usage: ``python -m bench.quantization --json out.json [--width 2048 --layers 7]
[--iters 20] [--repeats 5] [--method static|dynamic] [--threads N]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from central.quantize import load_calibration, quantize, split
from central.registry.validate import signature
from modelfleet.zoo import build_bench_model, build_digits
from modelfleet.zoo.digits import onnx_accuracy

TARGETS = {"size_ratio": 0.27, "accuracy_delta_pp": 0.5, "speedup_b32": 3.0}
WARMUP = 3
BATCHES = (1, 32)


@dataclass(frozen=True)
class Timing:
    """How to time: runs per repeat, repeats (the median is kept), intra-op threads."""

    iters: int
    repeats: int
    threads: int


def _session(path: Path, threads: int) -> ort.InferenceSession:
    """The session both precisions get: every optimisation, ``threads`` intra-op, CPU only."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _mean_run(session: ort.InferenceSession, feed: dict[str, np.ndarray], iters: int) -> float:
    """Mean wall time of ``iters`` runs."""
    started = time.perf_counter()
    for _ in range(iters):
        session.run(None, feed)
    return (time.perf_counter() - started) / iters


def seconds_per_run(
    sessions: dict[str, ort.InferenceSession], feed: dict[str, np.ndarray], iters: int, repeats: int
) -> dict[str, float]:
    """Per session: median over ``repeats`` of the mean time of ``iters`` runs, after warm-up.

    The sessions take turns within each repeat, so load from other processes on a
    shared machine hits both precisions alike instead of biasing whichever ran last."""
    for session in sessions.values():
        for _ in range(WARMUP):
            session.run(None, feed)
    means: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(repeats):
        for name, session in sessions.items():
            means[name].append(_mean_run(session, feed, iters))
    return {name: statistics.median(values) for name, values in means.items()}


def _quantize_file(fp32: Path, calibration: Path | None, out: Path, work: Path) -> dict[str, Any]:
    """Quantize as central does; returns the quantizer's report fields."""
    samples = None
    if calibration is not None:
        inputs, _ = signature(onnx.load(str(fp32)))
        samples, _ = split(load_calibration(calibration, inputs))
    result = quantize(fp32, out, calibration=samples, work_dir=work)
    return {
        "method": result.method,
        "per_channel": result.per_channel,
        "per_channel_fallback_reason": result.per_channel_fallback_reason,
        "quantize_seconds": result.seconds,
    }


def _timings(fp32: Path, int8: Path, name: str, width: int, timing: Timing) -> dict[str, float]:
    """Milliseconds per run and speedups at each batch size."""
    rng = np.random.default_rng(0)
    sessions = {"fp32": _session(fp32, timing.threads), "int8": _session(int8, timing.threads)}
    figures: dict[str, float] = {}
    for batch in BATCHES:
        feed = {name: rng.standard_normal((batch, width), dtype=np.float32)}
        times = seconds_per_run(sessions, feed, timing.iters, timing.repeats)
        figures[f"fp32_ms_b{batch}"] = round(times["fp32"] * 1e3, 5)
        figures[f"int8_ms_b{batch}"] = round(times["int8"] * 1e3, 5)
        figures[f"speedup_b{batch}"] = round(times["fp32"] / times["int8"], 3)
    return figures


def bench_model_figures(width: int, layers: int, timing: Timing, method: str) -> dict[str, Any]:
    """Sizes and speedups on the benchmark MLP."""
    model = build_bench_model(width=width, hidden_layers=layers)
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        int8 = Path(tmp) / "int8.onnx"
        calibration = model.calibration_path if method == "static" else None
        figures = _quantize_file(model.onnx_path, calibration, int8, Path(tmp) / "work")
        fp32_bytes, int8_bytes = model.onnx_path.stat().st_size, int8.stat().st_size
        figures.update(fp32_bytes=fp32_bytes, int8_bytes=int8_bytes, size_ratio=round(int8_bytes / fp32_bytes, 4))
        figures.update(_timings(model.onnx_path, int8, model.input_name, width, timing))
    return figures


def digits_figures() -> dict[str, Any]:
    """FP32 and INT8 accuracy of the digits classifier on its test split."""
    digits = build_digits()
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        int8 = Path(tmp) / "int8.onnx"
        report = _quantize_file(digits.onnx_path, digits.calibration_path, int8, Path(tmp) / "work")
        int8_accuracy = onnx_accuracy(int8, digits.test_x, digits.test_y, digits.input_name)
    fp32_accuracy = digits.fp32_test_accuracy
    return {
        "fp32_accuracy": fp32_accuracy,
        "int8_accuracy": int8_accuracy,
        "accuracy_delta_pp": round((fp32_accuracy - int8_accuracy) * 100, 3),
        "test_samples": len(digits.test_y),
        "digits_per_channel": report["per_channel"],
        "digits_per_channel_fallback_reason": report["per_channel_fallback_reason"],
    }


def run(width: int, layers: int, timing: Timing, method: str = "static") -> dict[str, Any]:
    """Every figure, the targets and whether each is met."""
    result: dict[str, Any] = {"width": width, "layers": layers, "iters": timing.iters, "repeats": timing.repeats}
    result.update(threads=timing.threads, cores=os.cpu_count(), onnxruntime=ort.__version__)
    result.update(bench_model_figures(width, layers, timing, method))
    result.update(digits_figures())
    result["targets"] = dict(TARGETS)
    result["met"] = {
        "size_ratio": result["size_ratio"] <= TARGETS["size_ratio"],
        "accuracy_delta_pp": result["accuracy_delta_pp"] <= TARGETS["accuracy_delta_pp"],
        "speedup_b32": result["speedup_b32"] >= TARGETS["speedup_b32"],
    }
    return result


_ROWS = (
    ("fp32_bytes", "FP32 bytes", None),
    ("int8_bytes", "INT8 bytes", None),
    ("size_ratio", "size ratio (INT8/FP32)", "size_ratio"),
    ("speedup_b1", "speedup, batch 1", None),
    ("speedup_b32", "speedup, batch 32", "speedup_b32"),
    ("fp32_accuracy", "digits FP32 accuracy", None),
    ("int8_accuracy", "digits INT8 accuracy", None),
    ("accuracy_delta_pp", "accuracy delta (pp)", "accuracy_delta_pp"),
)


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table: figure, value, target and whether it is met."""
    lines = [f"{'figure':<24} {'value':>14} {'target':>8}  met"]
    for key, title, target in _ROWS:
        goal = f"{TARGETS[target]:g}" if target else ""
        met = ("yes" if result["met"][target] else "NO") if target else ""
        value = result[key]
        shown = f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
        lines.append(f"{title:<24} {shown:>14} {goal:>8}  {met}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table and the JSON, write ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m bench.quantization", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the figures")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=7, help="hidden layers of the benchmark MLP")
    parser.add_argument("--iters", type=int, default=20, help="runs per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--method", choices=("static", "dynamic"), default="static")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads (default: cores)")
    args = parser.parse_args(argv)
    result = run(args.width, args.layers, Timing(args.iters, args.repeats, args.threads), args.method)
    print(format_table(result))
    text = json.dumps(result, indent=2)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
