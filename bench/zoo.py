"""Benchmark: every zoo model through central's quantization and an edge's artifact choice,
FP32 against the artifact the edge serves, on this machine.

For each model of ``modelfleet.zoo`` (trained ones with their calibration and eval data,
random ones for speed), in one process and one run:

1. central's push steps as a push runs them (``QuantizeStep`` then ``GuardStep``, default
   settings; random models get the threshold ``bench._fleet.RANDOM_MODEL_THRESHOLD``, their
   weights having no accuracy to keep) make the INT8 candidates and judge them;
2. an edge's ``ArtifactTimer`` (the code an edge runs, with its settings) times FP32 and
   every candidate that passed, and picks what it would serve;
3. a separate, longer timing (interleaved rounds, medians) compares FP32 with that pick
   side by side at batch 1 and batch 8 (the figures reported), and the eval data, where a
   model has it, gives both accuracies.

Targets (issue 12): ``min_speedup`` >= 1.0 (never slower than FP32), ``cnn_speedup_b8`` >= 1.7
(the largest CNN), ``transformer_speedup_b8`` >= 1.5 (the largest transformer),
``max_accuracy_delta_pp`` <= 1.0 (trained models). CPU flags are in every result: INT8 speed
depends on VNNI, AVX-512 and the core count.

    python -m bench.zoo --json bench/out/zoo.json
    python -m bench.zoo --json /tmp/z.json --models mlp-digits,resnet-digits --rounds 3"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench._fleet import RANDOM_MODEL_THRESHOLD
from bench.report import machine
from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize import GuardStep, QuantizeStep
from central.quantize.quantizer import model_bytes
from central.registry.pipeline import PushContext
from central.registry.validate import load_checked, signature
from central.settings import QuantizeSettings
from edge_node.inference.artifact_timer import ArtifactTimer, timing_inputs
from edge_node.inference.hardware import detect_hardware, read_cpu_flags
from edge_node.inference.session import SessionFactory, session_specs
from edge_node.settings import ChoiceSettings
from fleetwire.digest import sha256_file
from modelfleet.zoo.artifact import LABEL_KEY, ZooModel
from modelfleet.zoo.catalog import ZooEntry, zoo_models

FP32 = "fp32"
TARGETS = {"min_speedup": 1.0, "cnn_speedup_b8": 1.7, "transformer_speedup_b8": 1.5, "max_accuracy_delta_pp": 1.0}
PROVIDERS = ["CPUExecutionProvider"]
#: Rows of eval data each accuracy is measured on (all of a digits split: 450).
EVAL_BATCH = 64


def push_steps(model: ZooModel, trained: bool, work: Path) -> PushContext:
    """Central's quantize and guard steps on ``model``; the context holds candidates and report."""
    ctx = PushContext(
        name=model.name, version="bench", labels={}, upload=model.onnx_path, upload_sha256="",
        upload_size=model.size_bytes, work_dir=work, require_int8=True,  # a refusal is the row's guard verdict
        # Random models push without data: central generates inputs that respect the model
        # (their own calibration files are a handful of samples, below the guard's minimum).
        calibration=model.calibration_path if trained else None,
        eval_data=model.eval_path, threshold=None if trained else RANDOM_MODEL_THRESHOLD,
    )  # fmt: skip
    ctx.inputs, ctx.outputs = signature(load_checked(model.onnx_path))
    QuantizeStep(QuantizeSettings()).run(ctx)
    GuardStep().run(ctx)
    return ctx


def passed_candidates(ctx: PushContext) -> dict[str, Path]:
    """FP32 and every INT8 artifact the guard let through (what the manifest carries)."""
    names = [ctx.served_artifact, *ctx.alternatives]
    return {FP32: ctx.upload, **{n: ctx.artifacts[n] for n in names if n != FP32 and n in ctx.artifacts}}


def choose(candidates: dict[str, Path], factory: SessionFactory, budget_s: float) -> dict[str, Any]:
    """What an edge of this machine's class would serve, with its reason and quick speed-ups."""
    hardware = detect_hardware(PROVIDERS)
    timer = ArtifactTimer(factory, str(hardware), "bench", ChoiceSettings(budget_s=budget_s))
    keyed = {name: (path, f"bench-{name}-{sha256_file(path)[:16]}") for name, path in candidates.items()}
    choice = timer.choose(keyed)
    return {"artifact": choice.artifact, "reason": choice.reason, "hardware_class": str(hardware)}


def _median_runs(
    sessions: dict[str, ort.InferenceSession], feeds: dict[str, dict[str, np.ndarray]], rounds: int
) -> dict[str, float]:
    """Median seconds per run of each session, rounds interleaved so drift hits all alike."""
    runs: dict[str, list[float]] = {name: [] for name in sessions}
    for name, session in sessions.items():  # warm-up: allocations and thread pools
        session.run(None, feeds[name])
    for _ in range(rounds):
        for name, session in sessions.items():
            started = time.perf_counter()
            session.run(None, feeds[name])
            runs[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in runs.items()}


def side_by_side(paths: dict[str, Path], factory: SessionFactory, rounds: int, free_dim: int) -> dict[str, Any]:
    """FP32 against the served artifact at batch 1 and 8: medians (ms) and speed-ups."""
    sessions = {name: factory.create(path, f"bench-{name}-{sha256_file(path)[:16]}") for name, path in paths.items()}
    specs, _ = session_specs(sessions[FP32])
    batchable = all(s.shape and s.shape[0] < 0 for s in specs)
    out: dict[str, Any] = {}
    for batch in (1, 8) if batchable else (1,):
        feed = timing_inputs(specs, batch, free_dim)
        try:
            medians = _median_runs(sessions, {name: feed for name in sessions}, rounds)
        except Exception:  # a model whose positions stop short of free_dim: the edge's size
            free_dim = ChoiceSettings().free_dim
            feed = timing_inputs(specs, batch, free_dim)
            medians = _median_runs(sessions, {name: feed for name in sessions}, rounds)
        out["free_dim"] = free_dim
        served = next((n for n in medians if n != FP32), FP32)
        out[f"fp32_ms_b{batch}"] = round(medians[FP32] * 1e3, 3)
        out[f"served_ms_b{batch}"] = round(medians[served] * 1e3, 3)
        out[f"speedup_b{batch}"] = round(medians[FP32] / medians[served], 3) if served != FP32 else 1.0
    out.setdefault("speedup_b8", None)
    return out


def accuracy(path: Path, eval_path: Path) -> float:
    """Top-1 accuracy of the model at ``path`` on an eval file (inputs plus ``label``)."""
    with np.load(eval_path) as data:
        arrays = {k: data[k] for k in data.files}
    labels = arrays.pop(LABEL_KEY)
    session = ort.InferenceSession(str(path), providers=PROVIDERS)
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in arrays.items() if k in names}
    hits = 0
    for start in range(0, len(labels), EVAL_BATCH):
        batch = {k: v[start : start + EVAL_BATCH] for k, v in feeds.items()}
        outputs = session.run(None, batch)
        scores = next((o for o in outputs if o.ndim == 2 and o.shape[1] > 1), None)
        predicted = np.argmax(scores, axis=1) if scores is not None else np.asarray(outputs[0]).ravel()
        hits += int(np.sum(predicted == labels[start : start + EVAL_BATCH]))
    return hits / len(labels)


def _guard_summary(ctx: PushContext | None, error: str | None) -> dict[str, Any]:
    if error is not None or ctx is None or ctx.quantization is None:
        return {"verdict": "refused", "reason": error}
    q = ctx.quantization
    return {
        "verdict": "passed",
        "served_by_central": q.get("served"),
        "candidates": q.get("candidates"),
        "decided_by": q.get("decided_by"),
        "lower_bound": q.get("lower_bound"),
        "threshold": q.get("threshold"),
        "samples": q.get("samples"),
        "samples_source": q.get("samples_source"),
        # central's default INT8 artifact on the eval data, whatever the edge then served
        "int8_accuracy": q.get("int8_accuracy"),
        "int8_accuracy_delta_pp": q.get("accuracy_delta_pp"),
        "quantize_seconds": q.get("quantize_seconds"),
        "guard_seconds": q.get("guard_seconds"),
    }


def run_model(entry: ZooEntry, cache: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One model's row (see the module docstring)."""
    model = entry.build(cache)
    factory = SessionFactory(work / "sessions", PROVIDERS)
    ctx: PushContext | None = None
    error = None
    try:
        ctx = push_steps(model, entry.trained, work / "push")
        candidates = passed_candidates(ctx)
    except (AccuracyGuardFailed, QuantizationFailed) as exc:  # served as FP32, the refusal reported
        error = str(exc)
        candidates = {FP32: model.onnx_path}
    chosen = choose(candidates, factory, args.choice_budget_s) if len(candidates) > 1 else {"artifact": FP32}
    served = chosen["artifact"]
    paths = {FP32: model.onnx_path, **({served: candidates[served]} if served != FP32 else {})}
    row: dict[str, Any] = {
        "name": entry.name,
        "family": entry.family,
        "trained": entry.trained,
        "fp32_bytes": model.size_bytes,
        "artifact": served,
        "choice": chosen,
        "size_ratio": round(model_bytes(candidates[served]) / model.size_bytes, 4),
        **side_by_side(paths, factory, args.rounds, args.free_dim),
        "guard": _guard_summary(ctx, error),
        "fp32_accuracy": None,
        "served_accuracy": None,
        "accuracy_delta_pp": None,
    }
    if model.eval_path is not None:
        fp32_acc = accuracy(model.onnx_path, model.eval_path)
        served_acc = accuracy(candidates[served], model.eval_path) if served != FP32 else fp32_acc
        row.update(
            fp32_accuracy=round(fp32_acc, 4),
            served_accuracy=round(served_acc, 4),
            accuracy_delta_pp=round((fp32_acc - served_acc) * 100, 2),
        )
    return row


def _largest(rows: list[dict[str, Any]], family: str) -> dict[str, Any] | None:
    """The family's largest model: its speed-up is the family's figure (tiny ones are all overhead)."""
    found = [r for r in rows if r["family"] == family]
    return max(found, key=lambda r: r["fp32_bytes"]) if found else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures, the targets and whether each is met."""
    speedups = [s for r in rows for s in (r["speedup_b1"], r["speedup_b8"]) if s is not None]
    cnn, transformer = _largest(rows, "cnn"), _largest(rows, "transformer")
    deltas = [r["accuracy_delta_pp"] for r in rows if r["trained"] and r["accuracy_delta_pp"] is not None]
    figures = {
        "min_speedup": min(speedups) if speedups else None,
        "cnn_speedup_b8": cnn["speedup_b8"] if cnn else None,
        "cnn_model": cnn["name"] if cnn else None,
        "transformer_speedup_b8": transformer["speedup_b8"] if transformer else None,
        "transformer_model": transformer["name"] if transformer else None,
        "max_accuracy_delta_pp": max(deltas) if deltas else None,
    }
    met = {
        "min_speedup": figures["min_speedup"] is not None and figures["min_speedup"] >= TARGETS["min_speedup"],
        "cnn_speedup_b8": (figures["cnn_speedup_b8"] or 0) >= TARGETS["cnn_speedup_b8"],
        "transformer_speedup_b8": (figures["transformer_speedup_b8"] or 0) >= TARGETS["transformer_speedup_b8"],
        "max_accuracy_delta_pp": figures["max_accuracy_delta_pp"] is not None
        and figures["max_accuracy_delta_pp"] <= TARGETS["max_accuracy_delta_pp"],
    }
    return {**figures, "targets": TARGETS, "met": met}


def cpu_flags() -> list[str]:
    """The flags INT8 speed depends on, as /proc/cpuinfo has them."""
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp")
    present = set(read_cpu_flags().split())
    return [f for f in wanted if f in present]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every chosen model, in catalog order."""
    entries = {e.name: e for e in zoo_models(include_huge=args.include_huge)}
    names = args.models.split(",") if args.models else [n for n, e in entries.items() if not e.huge]
    unknown = [n for n in names if n not in entries]
    if unknown:
        raise SystemExit(f"unknown zoo models {unknown}; known: {sorted(entries)}")
    work = Path(tempfile.mkdtemp(prefix="bench-zoo-", dir=args.work_dir))
    rows = []
    try:
        for name in names:
            started = time.perf_counter()
            rows.append({**run_model(entries[name], args.model_cache, work / name, args)})
            rows[-1]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"{name}: {rows[-1]['artifact']} ({rows[-1]['seconds']} s)", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "bench": "zoo",
        "models": rows,
        **summarize(rows),
        "cpu_flags": cpu_flags(),
        "machine": machine(),
        "cores": len(os.sched_getaffinity(0)),
        "onnxruntime": ort.__version__,
        "rounds": args.rounds,
    }


def print_table(result: dict[str, Any]) -> None:
    """One row per model, then the targets."""
    print(f"{'model':<28} {'artifact':<15} {'size':>6} {'b1':>6} {'b8':>6} {'fp32 acc':>9} {'served':>7} {'Δpp':>6}")
    for r in result["models"]:
        b8 = "-" if r["speedup_b8"] is None else f"{r['speedup_b8']:.2f}"
        acc = "-" if r["fp32_accuracy"] is None else f"{r['fp32_accuracy']:.4f}"
        served = "-" if r["served_accuracy"] is None else f"{r['served_accuracy']:.4f}"
        delta = "-" if r["accuracy_delta_pp"] is None else f"{r['accuracy_delta_pp']:.2f}"
        print(
            f"{r['name']:<28} {r['artifact']:<15} {r['size_ratio']:>6.2f} {r['speedup_b1']:>6.2f} {b8:>6} "
            f"{acc:>9} {served:>7} {delta:>6}"
        )
    for key, target in result["targets"].items():
        sign = ">=" if key != "max_accuracy_delta_pp" else "<="
        print(f"{key} {result[key]} (target {sign} {target}) {'met' if result['met'][key] else 'MISSED'}")
    print(f"cpu flags: {' '.join(result['cpu_flags'])}; {result['machine']}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--models", default="", help="comma-separated zoo names (default: every model but the huge one)")
    p.add_argument("--include-huge", action="store_true", help="allow the >2 GiB model (name it in --models)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds of the side-by-side comparison")
    p.add_argument("--free-dim", type=int, default=128, help="size of variable non-batch dimensions (sequence)")
    p.add_argument("--choice-budget-s", type=float, default=20.0, help="the edge's artifact timer budget")
    p.add_argument("--model-cache", type=Path, default=None, help="zoo cache (default: the user's zoo cache)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temp dir goes")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    if args.rounds < 1 or args.free_dim < 1 or args.choice_budget_s <= 0:
        print("--rounds, --free-dim and --choice-budget-s must be positive", file=sys.stderr)
        return 2
    result = run(args)
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
