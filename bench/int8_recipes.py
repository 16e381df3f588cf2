"""INT8 recipes on this CPU: FP32 against every candidate central can make, by hand.

Takes the zoo's CNNs and transformers (``modelfleet.zoo.catalog``; by default the random
ResNet-18 at 3x224x224 and MiniLM-L6's shape), quantizes each with every recipe exactly
as central's quantize step does on a push with the model's calibration file
(``central.quantize``: the calibration split, the same prepared source, the transformer
optimizer before dynamic INT8), and times FP32 and each candidate at batch 1 and 8 on
the model's own inputs (eval data, else calibration data) with the session options
edges use (ORT_ENABLE_ALL, ``--threads`` intra-op threads, CPU provider), the models
taking turns within each repeat (``bench.quantization.seconds_per_run``). A CNN also
gets ``int8-dynamic`` and a transformer its unfused dynamic form and the fused FP32,
for comparison: central makes neither. Prints a table and, with ``--json``, writes the
figures with the CPU's flags and the recipe central would serve an edge of unknown
hardware here.

Usage: ``python -m bench.int8_recipes [--json out.json] [--models resnet18-224,transformer-minilm]
[--model-cache DIR] [--iters 10] [--repeats 5] [--threads N]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench.quantization import _session, seconds_per_run
from central.quantize.calibration import load_calibration, split
from central.quantize.cpu import cpu_flags, cpu_kind, reported_flags
from central.quantize.family import Family
from central.quantize.quantizer import Calibration, model_bytes, prepare, quantize_recipe
from central.quantize.recipes import DYNAMIC, RECIPES, S8S8_QDQ, U8S8_QDQ, U8S8_QOP, by_preference
from central.registry.validate import signature
from modelfleet.zoo.artifact import ZooModel
from modelfleet.zoo.catalog import ZooEntry, zoo_models

BATCHES = (1, 8)
DEFAULT_MODELS = "resnet18-224,transformer-minilm"
FAMILIES = ("cnn", "transformer")
FLAGS = cpu_flags()


def _data_file(model: ZooModel, path: Path | None) -> Path:
    if path is None:
        raise SystemExit(f"{model.name} has no calibration data")
    return path


def _calibration_samples(model: ZooModel) -> dict[str, np.ndarray]:
    """The model's calibration file, read as central reads a push's, less the share it holds out for the guard."""
    inputs, _ = signature(onnx.load(str(model.onnx_path), load_external_data=False))
    samples, _ = split(load_calibration(_data_file(model, model.calibration_path), inputs))
    return samples


def _feeds(model: ZooModel, batch: int) -> dict[str, np.ndarray]:
    """``batch`` rows of the model's eval data (trained models) or calibration data, repeated if short."""
    with np.load(_data_file(model, model.eval_path or model.calibration_path)) as data:
        arrays = {name: data[name] for name in model.input_names}
    rows = np.resize(np.arange(len(next(iter(arrays.values())))), batch)
    return {name: array[rows] for name, array in arrays.items()}


def _candidates(model: ZooModel, family: Family, work: Path) -> dict[str, dict[str, Any]]:
    """Every recipe's model (name → path, bytes, seconds), made as central makes it."""
    fp32 = model.onnx_path
    made: dict[str, dict[str, Any]] = {}
    if family == "cnn":
        source = prepare(fp32, work / "prep", "cnn")
        calibration = Calibration(_calibration_samples(model), 32, cache=work / "prep" / "ranges.json")
        plain = source
        recipes = [U8S8_QDQ, S8S8_QDQ, U8S8_QOP, DYNAMIC]
    else:
        source = prepare(fp32, work / "prep", "transformer")
        # ORT's symbolic shape inference gives up on the encoder's position slice and writes its
        # partial model (tens of MB) into the current directory: keep that in the work dir.
        with contextlib.chdir(work):
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


def _time(model: ZooModel, made: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """Adds ``ms_b{n}``, ``speedup_b{n}`` and ``cosine_b{n}`` to every candidate, and FP32's."""
    fp32 = model.onnx_path
    for batch in BATCHES:
        feed = _feeds(model, batch)
        paths = {"fp32": fp32, **{n: m["path"] for n, m in made.items()}}
        sessions = {n: _session(p, args.threads) for n, p in paths.items()}
        reference = sessions["fp32"].run(None, feed)[0]
        times = seconds_per_run(sessions, feed, args.iters, args.repeats)
        made.setdefault("fp32", {"path": fp32, "bytes": model_bytes(fp32), "quantize_s": 0.0})
        for name, seconds in times.items():
            made[name][f"ms_b{batch}"] = round(seconds * 1e3, 3)
            made[name][f"speedup_b{batch}"] = round(times["fp32"] / seconds, 3)
            made[name][f"cosine_b{batch}"] = round(_cosine(reference, sessions[name].run(None, feed)[0]), 5)


def _bench(entry: ZooEntry, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    model = entry.build(args.model_cache)
    family = entry.family
    made = _candidates(model, family, work)
    _time(model, made, args)
    produced = [U8S8_QDQ, S8S8_QDQ, U8S8_QOP] if family == "cnn" else [DYNAMIC]  # what central makes
    fp32_bytes = made["fp32"]["bytes"]
    order = ["fp32", *(n for n in made if n != "fp32")]
    rows = {
        n: {k: v for k, v in made[n].items() if k != "path"} | {"size_ratio": round(made[n]["bytes"] / fp32_bytes, 4)}
        for n in order
    }
    return {
        "name": entry.name,
        "description": entry.description,
        "family": family,
        "fp32_bytes": fp32_bytes,
        "central_serves": by_preference(produced, FLAGS, family)[0],
        "artifacts": rows,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['name']}: {result['description']} ({result['family']}, FP32 {result['fp32_bytes'] / 1e6:.1f} MB)")
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
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated zoo CNNs and transformers")
    p.add_argument("--model-cache", type=Path, default=None, help="zoo cache (default: the user's zoo cache)")
    p.add_argument("--iters", type=int, default=10, help="runs per repeat")
    p.add_argument("--repeats", type=int, default=5, help="repeats; the median is kept")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads")
    return p


def _entries(names: str) -> list[ZooEntry]:
    """The zoo's CNNs and transformers called ``names`` (comma-separated), in that order."""
    known = {e.name: e for e in zoo_models() if e.family in FAMILIES}
    unknown = [n for n in names.split(",") if n not in known]
    if unknown:
        raise SystemExit(f"not a zoo CNN or transformer: {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    entries = _entries(args.models)
    results: list[dict[str, Any]] = []
    print(f"CPU: {cpu_kind(FLAGS)}, flags {', '.join(reported_flags(FLAGS))}; {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        for entry in entries:
            results.append(_bench(entry, Path(tmp) / entry.name, args))
            _print(results[-1])
    doc = {"cpu_flags": reported_flags(FLAGS), "cpu_kind": cpu_kind(FLAGS), "threads": args.threads, "models": results}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
