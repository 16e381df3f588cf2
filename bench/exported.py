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

from bench.report import machine
from bench.zoo import FP32, PROVIDERS, cpu_flags, side_by_side
from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize import GuardStep, QuantizeStep
from central.quantize.cpu import cpu_kind
from central.quantize.quantizer import model_bytes
from central.registry.pipeline import PushContext
from central.registry.validate import load_checked, signature
from central.settings import QuantizeSettings
from edge_node.inference.session import SessionFactory

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "exported"
TARGETS = {"bert_speedup_b8": 1.5}


def push_steps(graph: Path, work: Path) -> PushContext:
    """Central's quantize and guard steps on ``graph`` with default settings."""
    ctx = PushContext(
        name=graph.parent.name, version="bench", labels={}, upload=graph, upload_sha256="",
        upload_size=graph.stat().st_size, work_dir=work,
        require_int8=True,  # a refusal is the row's error (a push would serve FP32 and say why)
    )  # fmt: skip
    ctx.inputs, ctx.outputs = signature(load_checked(graph))
    QuantizeStep(QuantizeSettings()).run(ctx)
    GuardStep().run(ctx)
    return ctx


def run_model(directory: Path, work: Path, rounds: int, free_dim: int) -> dict[str, Any]:
    """One model's row: what central did with it, and FP32 against what it serves."""
    graph = directory / "model.onnx"
    row: dict[str, Any] = {"name": directory.name, "fp32_bytes": model_bytes(graph), "error": None}
    try:
        ctx = push_steps(graph, work / "push")
        served = ctx.served_artifact
    except (AccuracyGuardFailed, QuantizationFailed) as exc:  # reported; FP32 against itself
        row["error"], served, ctx = str(exc), FP32, None
    report = (ctx.quantization if ctx else None) or {}
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


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest BERT's speed-up at batch 8 against the target."""
    berts = [r for r in rows if r["family"] == "transformer"]
    largest = max(berts, key=lambda r: r["fp32_bytes"]) if berts else None
    speedup = largest["speedup_b8"] if largest else None
    return {
        "bert_speedup_b8": speedup,
        "bert_model": largest["name"] if largest else None,
        "targets": TARGETS,
        "met": {"bert_speedup_b8": (speedup or 0) >= TARGETS["bert_speedup_b8"]},
    }


def run(models: list[Path], rounds: int, free_dim: int, work_dir: Path | None = None) -> dict[str, Any]:
    """Every model directory, in order."""
    work = Path(tempfile.mkdtemp(prefix="bench-exported-", dir=work_dir))
    try:
        rows = [run_model(m, work / f"{i}-{m.name}", rounds, free_dim) for i, m in enumerate(models)]
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
    }


def print_table(result: dict[str, Any]) -> None:
    """One row per model, then the target and the CPU."""
    print(f"{'model':<16} {'artifact':<15} {'size':>6} {'b1':>6} {'b8':>6}  normalized")
    for r in result["models"]:
        b8 = "-" if r["speedup_b8"] is None else f"{r['speedup_b8']:.2f}"
        cleaned = "; ".join(r["normalized"] or []) or "-"
        print(f"{r['name']:<16} {r['artifact']:<15} {r['size_ratio']:>6.2f} {r['speedup_b1']:>6.2f} {b8:>6}  {cleaned}")
    met = "met" if result["met"]["bert_speedup_b8"] else "MISSED"
    print(f"bert_speedup_b8 {result['bert_speedup_b8']} (target >= {TARGETS['bert_speedup_b8']}) {met}")
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
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    models = args.model or sorted(p for p in FIXTURES.iterdir() if (p / "model.onnx").is_file())
    missing = [str(m) for m in models if not (m / "model.onnx").is_file()]
    if missing or args.rounds < 1 or args.free_dim < 1:
        print(f"no model.onnx in {missing}" if missing else "--rounds and --free-dim must be positive", file=sys.stderr)
        return 2
    result = run(models, args.rounds, args.free_dim, args.work_dir)
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
