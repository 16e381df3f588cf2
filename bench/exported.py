"""Benchmark: what torch's default exporter writes, through central's quantization, INT8
against FP32 on this machine (issue 25).

No torch here: it takes models already exported, by default the test fixtures
(``tests/fixtures/exported/``: a BERT classifier, an opset-23 BERT, a ResNet-style CNN,
each ``model.onnx`` plus ``model.onnx.data``), or the directories given with ``--model``,
e.g. the issue's 6-layer, 384-wide BERT, exported with the fixture script::

    /path/to/torchvenv/bin/python scripts/export_fixtures.py --bert-only --out /tmp/exp \\
        --bert-layers 6 --bert-hidden 384 --bert-vocab 30522
    python -m bench.exported --json bench/out/exported.json --model /tmp/exp/bert

For each model: central's quantize and guard steps as a push without data runs them
(what they cleaned in the graph is in the row), then FP32 against the served INT8
artifact side by side in the sessions an edge makes (``bench.zoo.side_by_side``:
interleaved rounds, medians) at batch 1 and 8. INT8 speed depends on VNNI, AVX-512 and
the core count: the CPU flags are in the result. Target: ``bert_speedup_b8`` >= 1.5 (the
largest BERT given) on a VNNI CPU."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import onnxruntime as ort

from bench.promotion import live_promotion
from bench.report import machine
from bench.zoo import FP32, PROVIDERS, cpu_flags, side_by_side
from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize import GuardStep, QuantizeStep
from central.quantize.cpu import cpu_kind
from central.quantize.quantizer import model_bytes
from central.quantize.synthetic import Sizes, generated_samples, input_hints
from central.registry.pipeline import PushContext
from central.registry.validate import load_checked, signature
from central.settings import QuantizeSettings
from edge_node.inference.session import SessionFactory
from modelfleet.zoo.artifact import write_npz

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "exported"
TARGETS: dict[str, float] = {
    "exported_pushes_served": 2,
    "exported_cnn_speedup_b8": 1.7,
    "exported_transformer_speedup_b8": 1.5,
    "promotion_requests": 5000,
}


def push_steps(graph: Path, work: Path, calibration_rows: int = 0, free_dim: int = 128) -> PushContext:
    """Central's quantize and guard steps on ``graph`` with default settings, as a user's push:
    without data, or with ``calibration_rows`` generated rows as the ``calibration`` file."""
    work.mkdir(parents=True, exist_ok=True)
    ctx = PushContext(
        name=graph.parent.name, version="bench", labels={}, upload=graph, upload_sha256="",
        upload_size=graph.stat().st_size, work_dir=work,
    )  # fmt: skip
    model = load_checked(graph)
    ctx.inputs, ctx.outputs = signature(model)
    if calibration_rows:
        rows = generated_samples(ctx.inputs, calibration_rows, seed=3, hints=input_hints(model),
                                 sizes=Sizes(sequence=free_dim))  # fmt: skip
        ctx.calibration = work / "calibration.npz"
        write_npz(ctx.calibration, rows)
    QuantizeStep(QuantizeSettings()).run(ctx)
    GuardStep().run(ctx)
    return ctx


def run_model(directory: Path, work: Path, rounds: int, free_dim: int, calibration_rows: int) -> dict[str, Any]:
    """One model's row: what central did with it (a CNN pushed with ``calibration_rows`` images,
    as the issue's ResNet-18 was; a pending candidate promoted on live traffic), and FP32
    against what it serves at the end."""
    graph = directory / "model.onnx"
    row: dict[str, Any] = {"name": directory.name, "fp32_bytes": model_bytes(graph), "error": None, "live": None}
    cnn = len(signature(load_checked(graph))[0][0].shape) == 4
    try:
        ctx = push_steps(graph, work / "push", calibration_rows if cnn else 0, free_dim)
        served = ctx.served_artifact
    except (AccuracyGuardFailed, QuantizationFailed) as exc:  # the push was lost
        row["error"], served, ctx = str(exc), FP32, None
    report = (ctx.quantization if ctx else None) or {}
    row["pushed_artifact"] = served
    row["int8_status"] = (report.get("int8") or {}).get("status")
    if ctx is not None and ctx.pending:
        row["live"] = live_promotion(ctx, graph, batch=8, free_dim=free_dim)
        if row["live"]["decision"] == "int8_promoted":
            served = ctx.pending[0]
    normalized = report.get("normalized") or {}
    paths = {FP32: graph, **({served: ctx.artifacts[served]} if ctx and served != FP32 else {})}
    factory = SessionFactory(work / "sessions", PROVIDERS)
    row.update(
        family=report.get("family"),
        artifact=served,
        normalized=normalized.get("changes"),
        kept_fp32=normalized.get("kept_fp32"),
        size_ratio=round(model_bytes(paths[served]) / row["fp32_bytes"], 4),
        guard={k: report.get(k) for k in ("metric", "agreement", "lower_bound", "threshold", "samples")},
        **side_by_side(paths, factory, rounds, free_dim),
    )
    return row


def _largest(rows: list[dict[str, Any]], family: str) -> dict[str, Any] | None:
    found = [r for r in rows if r["family"] == family]
    return max(found, key=lambda r: r["fp32_bytes"]) if found else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest BERT's and CNN's figures against the targets."""
    bert, cnn = _largest(rows, "transformer"), _largest(rows, "cnn")
    chosen = [r for r in (bert, cnn) if r is not None]
    live = [r["live"] for r in chosen if r["live"]]
    figures: dict[str, Any] = {
        "exported_pushes_served": sum(r["error"] is None for r in chosen),
        "exported_cnn_speedup_b8": cnn["speedup_b8"] if cnn else None,
        "exported_transformer_speedup_b8": bert["speedup_b8"] if bert else None,
        "promotion_requests": max((x["promotion_requests"] or 10**9 for x in live), default=None),
    }
    met = {key: (figures[key] or 0) >= target for key, target in TARGETS.items() if key != "promotion_requests"}
    requests = figures["promotion_requests"]
    met["promotion_requests"] = requests is not None and requests <= TARGETS["promotion_requests"]
    return {
        **figures,
        "bert_speedup_b8": figures["exported_transformer_speedup_b8"],
        "bert_model": bert["name"] if bert else None,
        "cnn_model": cnn["name"] if cnn else None,
        "targets": TARGETS,
        "met": met,
    }


def run(
    models: list[Path], rounds: int, free_dim: int, work_dir: Path | None = None, calibration_rows: int = 32
) -> dict[str, Any]:
    """Every model directory, in order."""
    work = Path(tempfile.mkdtemp(prefix="bench-exported-", dir=work_dir))
    try:
        rows = [run_model(m, work / f"{i}-{m.name}", rounds, free_dim, calibration_rows) for i, m in enumerate(models)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    flags = cpu_flags()
    return {
        "bench": "exported",
        "models": rows,
        **summarize(rows),
        "cpu_flags": flags,
        "cpu_kind": cpu_kind(frozenset(flags)),
        "machine": machine(),
        "cores": len(os.sched_getaffinity(0)),
        "onnxruntime": ort.__version__,
        "rounds": rounds,
        "free_dim": free_dim,
        "calibration_rows": calibration_rows,
    }


def print_table(result: dict[str, Any]) -> None:
    """One row per model, then the target and the CPU."""
    print(f"{'model':<16} {'pushed':<10} {'artifact':<15} {'size':>6} {'b1':>6} {'b8':>6}  live / normalized")
    for r in result["models"]:
        b8 = "-" if r["speedup_b8"] is None else f"{r['speedup_b8']:.2f}"
        cleaned = "; ".join(r["normalized"] or []) or "-"
        live = r["live"]
        story = f"{live['decision']} after {live['requests']} requests; " if live else ""
        print(f"{r['name']:<16} {r['int8_status'] or '-':<10} {r['artifact']:<15} {r['size_ratio']:>6.2f} "
              f"{r['speedup_b1']:>6.2f} {b8:>6}  {story}{cleaned}")  # fmt: skip
    for key, target in TARGETS.items():
        word = "<=" if key == "promotion_requests" else ">="
        print(f"{key} {result[key]} (target {word} {target}) {'met' if result['met'][key] else 'MISSED'}")
    print(f"cpu flags: {' '.join(result['cpu_flags'])} ({result['cpu_kind']}); {result['machine']}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.exported", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    what = "a directory with model.onnx (and its data file); repeatable (default: the fixtures)"
    p.add_argument("--model", type=Path, action="append", default=[], help=what)
    p.add_argument("--rounds", type=int, default=30, help="timed rounds of the side-by-side comparison")
    p.add_argument("--free-dim", type=int, default=128, help="size of variable non-batch dimensions (sequence)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temp dir goes")
    p.add_argument("--calibration-rows", type=int, default=32, help="generated calibration rows a CNN is pushed with")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    models = args.model or sorted(p for p in FIXTURES.iterdir() if (p / "model.onnx").is_file())
    missing = [str(m) for m in models if not (m / "model.onnx").is_file()]
    if missing or args.rounds < 1 or args.free_dim < 1:
        print(f"no model.onnx in {missing}" if missing else "--rounds and --free-dim must be positive", file=sys.stderr)
        return 2
    result = run(models, args.rounds, args.free_dim, args.work_dir, args.calibration_rows)
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
