"""INT8 recipes on this CPU: FP32 against every candidate central can make, by hand.

Builds a ResNet-style CNN and a BERT-style encoder (``bench.graphs``, random seeded
weights), quantizes each with every recipe exactly as central's quantize step does
(``central.quantize``: the same prepared source, generated calibration images for
the CNN, the transformer optimizer before dynamic INT8), and times FP32 and each
candidate at batch 1 and 8 with the session options edges use (ORT_ENABLE_ALL,
``--threads`` intra-op threads, CPU provider), the models taking turns within each
repeat (``bench.quantization.seconds_per_run``). The CNN also gets ``int8-dynamic``
and the encoder its unfused dynamic form and the fused FP32, for comparison: central
makes neither. Prints a table and, with ``--json``, writes the figures with the
CPU's flags and the recipe central would serve an edge of unknown hardware here.

Usage: ``python -m bench.int8_recipes [--json out.json] [--image 64] [--seq 128]
[--hidden 256 --layers 4] [--iters 10] [--repeats 5] [--threads N] [--models cnn,transformer]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench.graphs import build_cnn, build_transformer
from bench.quantization import _session, seconds_per_run
from central.quantize.cpu import cpu_flags, cpu_kind, reported_flags
from central.quantize.family import Family
from central.quantize.quantizer import Calibration, model_bytes, prepare, quantize_recipe
from central.quantize.recipes import DYNAMIC, RECIPES, S8S8_QDQ, U8S8_QDQ, U8S8_QOP, by_preference
from central.quantize.synthetic import Sizes, generated_samples, input_hints
from central.registry.validate import signature

BATCHES = (1, 8)
CALIBRATION_SAMPLES = 64
FLAGS = cpu_flags()


def _feeds(path: Path, batch: int, sizes: Sizes, seed: int) -> dict[str, np.ndarray]:
    model = onnx.load(str(path), load_external_data=False)
    return generated_samples(signature(model)[0], batch, seed, hints=input_hints(model), sizes=sizes)


def _candidates(fp32: Path, family: Family, work: Path, sizes: Sizes) -> dict[str, dict[str, Any]]:
    """Every recipe's model (name → path, bytes, seconds), made as central makes it."""
    made: dict[str, dict[str, Any]] = {}
    if family == "cnn":
        source = prepare(fp32, work / "prep", "cnn")
        calibration = Calibration(_feeds(fp32, CALIBRATION_SAMPLES, sizes, 1), 32, cache=work / "prep" / "ranges.json")
        plain = source
        recipes = [U8S8_QDQ, S8S8_QDQ, U8S8_QOP, DYNAMIC]
    else:
        source = prepare(fp32, work / "prep", "transformer")
        plain = prepare(fp32, work / "plain", "mlp")
        calibration, recipes = None, [DYNAMIC]
    for name in recipes:
        out = work / name / "model.onnx"
        result = quantize_recipe(source, fp32, out, RECIPES[name], calibration=calibration)
        made[name] = {"path": out, "bytes": result.int8_bytes, "quantize_s": result.seconds}
    if family == "transformer":
        out = work / "unfused" / "model.onnx"
        result = quantize_recipe(plain, fp32, out, RECIPES[DYNAMIC], calibration=None)
        made["int8-dynamic-unfused"] = {"path": out, "bytes": result.int8_bytes, "quantize_s": result.seconds}
        made["fp32-fused"] = {"path": source.path, "bytes": model_bytes(source.path), "quantize_s": 0.0}
    return made


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _time(fp32: Path, made: dict[str, dict[str, Any]], sizes: Sizes, args: argparse.Namespace) -> None:
    """Adds ``ms_b{n}``, ``speedup_b{n}`` and ``cosine_b{n}`` to every candidate, and FP32's."""
    for batch in BATCHES:
        feed = _feeds(fp32, batch, sizes, 7)
        paths = {"fp32": fp32, **{n: m["path"] for n, m in made.items()}}
        sessions = {n: _session(p, args.threads) for n, p in paths.items()}
        reference = sessions["fp32"].run(None, feed)[0]
        times = seconds_per_run(sessions, feed, args.iters, args.repeats)
        made.setdefault("fp32", {"path": fp32, "bytes": model_bytes(fp32), "quantize_s": 0.0})
        for name, seconds in times.items():
            made[name][f"ms_b{batch}"] = round(seconds * 1e3, 3)
            made[name][f"speedup_b{batch}"] = round(times["fp32"] / seconds, 3)
            made[name][f"cosine_b{batch}"] = round(_cosine(reference, sessions[name].run(None, feed)[0]), 5)


def _bench(name: str, family: Family, fp32: Path, sizes: Sizes, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    made = _candidates(fp32, family, work, sizes)
    _time(fp32, made, sizes, args)
    produced = [U8S8_QDQ, S8S8_QDQ, U8S8_QOP] if family == "cnn" else [DYNAMIC]  # what central makes
    fp32_bytes = made["fp32"]["bytes"]
    order = ["fp32", *(n for n in made if n != "fp32")]
    rows = {
        n: {k: v for k, v in made[n].items() if k != "path"} | {"size_ratio": round(made[n]["bytes"] / fp32_bytes, 4)}
        for n in order
    }
    return {
        "name": name,
        "family": family,
        "fp32_bytes": fp32_bytes,
        "central_serves": by_preference(produced, FLAGS, family)[0],
        "artifacts": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['name']} ({result['family']}, FP32 {result['fp32_bytes'] / 1e6:.1f} MB)")
    print(
        f"  {'artifact':<22}{'size':>7}{'quant s':>9}"
        + "".join(f"{'ms b' + str(b):>10}{'x b' + str(b):>8}" for b in BATCHES)
    )
    for name, row in result["artifacts"].items():
        cells = "".join(f"{row[f'ms_b{b}']:>10.2f}{row[f'speedup_b{b}']:>8.2f}" for b in BATCHES)
        print(f"  {name:<22}{row['size_ratio']:>7.2f}{row['quantize_s']:>9.1f}{cells}")
    print(f"  central serves an edge of unknown hardware here: {result['central_serves']}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.int8_recipes", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--models", default="cnn,transformer", help="comma-separated: cnn, transformer")
    p.add_argument("--image", type=int, default=64, help="CNN input height and width (3 channels)")
    p.add_argument("--widths", default="64,128,256,512", help="CNN stage widths (ResNet-18's by default)")
    p.add_argument("--seq", type=int, default=128, help="transformer sequence length")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--iters", type=int, default=10, help="runs per repeat")
    p.add_argument("--repeats", type=int, default=5, help="repeats; the median is kept")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    wanted = set(args.models.split(","))
    results: list[dict[str, Any]] = []
    print(f"CPU: {cpu_kind(FLAGS)}, flags {', '.join(reported_flags(FLAGS))}; {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        work = Path(tmp)
        if "cnn" in wanted:
            widths = tuple(int(w) for w in args.widths.split(","))
            cnn = build_cnn(work / "cnn.onnx", image=args.image, widths=widths, blocks=2)
            results.append(_bench(f"resnet-like 3x{args.image}x{args.image}", "cnn", cnn, Sizes(), work / "c", args))
            _print(results[-1])
        if "transformer" in wanted:
            heads = max(1, args.hidden // 64)
            bert = build_transformer(
                work / "bert.onnx", vocab=args.vocab, hidden=args.hidden, heads=heads, layers=args.layers
            )
            sizes = Sizes({"seq": args.seq})
            name = f"bert-like {args.layers}x{args.hidden} seq {args.seq}"
            results.append(_bench(name, "transformer", bert, sizes, work / "t", args))
            _print(results[-1])
    doc = {"cpu_flags": reported_flags(FLAGS), "cpu_kind": cpu_kind(FLAGS), "threads": args.threads, "models": results}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
