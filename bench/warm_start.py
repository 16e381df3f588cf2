"""Warm-start benchmark: how fast a restarted edge serves again, against a cold one.

One central (a real process on loopback) with one model pushed (the benchmark MLP,
or ``--model digits``; with its calibration file, so INT8 once central quantizes).
Then, per repeat:

* cold: an edge process with an empty data dir and chunk cache starts; it fetches
  every chunk from central, assembles the model, optimizes it (ORT_ENABLE_ALL, written
  to its optimized-model cache) and loads it;
* warm: that edge is stopped cleanly (SIGTERM) and started again on the same data dir
  and cache: chunks cached, model assembled, optimized model cached.

Each start is timed from just before the process is spawned to the first
``GET /v2/models/{m}/ready`` answering 200 (polled every few ms). The breakdown of
each: ``healthz_s`` (the HTTP server answers ``/healthz``: interpreter start plus
imports plus start-up; a warm edge checks and loads its models meanwhile, so
``complete_s`` may come first), ``ready_line_s`` (the
edge printed its ready line), ``complete_s`` (the version's ``completed_at`` in
``/api/v1/status``: fetch and assembly done, or found complete on disk) and
``load_s`` (from there to serving: session creation and warm-up). ``cold_ready_s`` and
``warm_ready_s`` are medians over repeats; ``ratio`` = warm / cold (target <= 0.2).

``floor_s`` is what no edge can start under on this machine: a fresh interpreter that
imports onnxruntime and numpy and exits (``python -c "import onnxruntime, numpy"``),
timed the same way (spawn to exit) a few times beside each warm restart, median over
the run, so both see the same load. ``overhead_ratio`` = ``warm_ready_s`` / ``floor_s``
(target <= 1.5): what the edge adds on top of the inference runtime itself (its own
imports, HTTP server, settings, disk checks, session creation). ``cpu_flags`` and
``machine`` say where it ran.

The size section (``bench._warm_size``; ``--big-mb 0`` skips it) asks whether a warm restart
slows down with the model: ``big_over_small`` = warm ready with a ``--big-mb`` MiB model
(default 2048: a random embedding table in external data) / warm ready with the digits
model (target <= 1.5), and ``big_over_small_rehash``, the same with every file re-hashed at
start (``MODELFLEET_VERSIONS__REHASH_ALL``: the behaviour before the verified records),
measured in the same run.

Usage: ``python -m bench.warm_start --json out.json [--model bench|digits]
[--width 2048 --layers 7] [--repeats 3] [--timeout-s 120] [--require-int8]
[--big-mb 2048] [--big-timeout-s 900]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._edge_start import median_of, time_start
from bench._fleet import RANDOM_MODEL_THRESHOLD, Fleet, parse_env_pairs, sigterm_raises, write_result
from bench._warm_size import size_section
from bench.report import machine
from bench.zoo import cpu_flags
from modelfleet.zoo import build_bench_model, build_digits

TARGETS = {"ratio": 0.2, "overhead_ratio": 1.5, "big_over_small": 1.5}
VERSION = "v1"
#: The floor: the inference runtime's own start, which no edge can go under.
FLOOR_CODE = "import onnxruntime, numpy"
#: Floor processes timed beside each warm restart.
FLOOR_RUNS = 3


def time_floor(runs: int = FLOOR_RUNS) -> list[float]:
    """Seconds from spawn to exit of ``runs`` fresh interpreters running ``FLOOR_CODE``."""
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", FLOOR_CODE], check=True, stdin=subprocess.DEVNULL)
        times.append(time.monotonic() - t0)
    return times


def _ort_cache_files(fleet: Fleet, node_id: str) -> list[str]:
    cache = fleet.edges[node_id].data_dir / "ort-cache"
    return sorted(p.name for p in cache.glob("*.onnx")) if cache.is_dir() else []


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Push the model, then per repeat one cold start and one warm restart; summarise."""
    if args.model == "digits":
        digits = build_digits()
        model_path, calibration, name = digits.onnx_path, digits.calibration_path, "digits"
        threshold = None
    else:
        bench = build_bench_model(width=args.width, hidden_layers=args.layers)
        model_path, calibration, name = bench.onnx_path, bench.calibration_path, "bench-mlp"
        threshold = RANDOM_MODEL_THRESHOLD
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    edge_env, central_env = parse_env_pairs(args.edge_env), parse_env_pairs(args.central_env)
    cold: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    floors: list[float] = []
    log(f"model {name}: {model_path.stat().st_size / 1e6:.1f} MB FP32; {args.repeats} repeat(s); {os.cpu_count()} CPUs")
    with Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
        fleet.start_central()
        pushed = fleet.push_files(name, VERSION, model_path, calibration=calibration, threshold=threshold)
        artifact = pushed.manifest.get("artifact")
        log(f"served artifact: {artifact} ({pushed.manifest.get('size', 0) / 1e6:.1f} MB)")
        if args.require_int8 and not str(artifact).startswith("int8"):
            raise Int8Required(f"--require-int8: central serves {name} as {artifact!r}")
        for i in range(args.repeats):
            node = f"w{i}"
            c = time_start(fleet, node, name, args.timeout_s)
            c["ort_cache_files"] = _ort_cache_files(fleet, node)
            c["stop_rc"] = fleet.stop_edge(node)
            cold.append(c)
            w = time_start(fleet, node, name, args.timeout_s)
            w["stop_rc"] = fleet.stop_edge(node)
            warm.append(w)
            floors += time_floor()
            log(f"  repeat {i}: cold {_fmt(c['ready_s'])} s, warm {_fmt(w['ready_s'])} s" + _note(c, w))
    size = size_section(args, work, log) if args.big_mb > 0 else {}
    cold_s, warm_s = median_of([c["ready_s"] for c in cold]), median_of([w["ready_s"] for w in warm])
    failed = [r["error"] for r in (*cold, *warm) if r["error"]]
    failed += [e for part in ("small", "big") for e in size.get(part, {}).get("errors", [])]
    big_over_small = size.get("big_over_small") if not failed else None
    ratio = warm_s / cold_s if cold_s and warm_s is not None and len(failed) == 0 else None
    floor_s = statistics.median(floors)
    overhead = warm_s / floor_s if warm_s is not None and len(failed) == 0 else None
    breakdown = {
        phase: {
            key: median_of([r[key] for r in runs])
            for key in ("healthz_s", "ready_line_s", "complete_s", "load_s", "ready_s")
        }
        for phase, runs in (("cold", cold), ("warm", warm))
    }
    return {
        "model": name,
        "artifact": artifact,
        "model_bytes": pushed.manifest.get("size"),
        "repeats": args.repeats,
        "cold_ready_s": cold_s,
        "warm_ready_s": warm_s,
        "ratio": ratio,
        "floor_s": floor_s,
        "overhead_ratio": overhead,
        "healthz_floor_s": median_of([r["healthz_s"] for r in (*cold, *warm)]),
        "breakdown": breakdown,
        **{k: v for k, v in size.items() if k not in ("small", "big", "big_over_small")},
        "big_over_small": big_over_small,
        "size": {k: size[k] for k in ("small", "big") if k in size},
        "errors": failed,
        "targets": dict(TARGETS),
        "met": {
            "ratio": ratio is not None and ratio <= TARGETS["ratio"],
            "overhead_ratio": overhead is not None and overhead <= TARGETS["overhead_ratio"],
            "big_over_small": big_over_small is not None and big_over_small <= TARGETS["big_over_small"],
        },
        "cpu_flags": cpu_flags(),
        "machine": machine(),
        "settings": {
            "width": args.width if name == "bench-mlp" else None,
            "layers": args.layers if name == "bench-mlp" else None,
            "timeout_s": args.timeout_s,
            "edge_env": edge_env,
            "central_env": central_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "floor_code": FLOOR_CODE,
            "big_mb": args.big_mb,
            "big_timeout_s": args.big_timeout_s,
        },
        "runs": {"cold": cold, "warm": warm, "floor_s": floors},
    }


class Int8Required(RuntimeError):
    """``--require-int8`` and central served the model as something else."""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _note(cold: dict[str, Any], warm: dict[str, Any]) -> str:
    errors = [r["error"] for r in (cold, warm) if r["error"]]
    return f" ({'; '.join(errors)})" if errors else ""


def print_table(result: dict[str, Any]) -> None:
    """Per phase: the medians of each mark; then the ratio against the target."""
    header = f"{'start':<6} {'healthz s':>9} {'ready line s':>12} {'complete s':>10} {'load s':>7} {'ready s':>8}"
    print(header)
    print("-" * len(header))
    for phase, b in result["breakdown"].items():
        print(
            f"{phase:<6} {_fmt(b['healthz_s']):>9} {_fmt(b['ready_line_s']):>12} {_fmt(b['complete_s']):>10} "
            f"{_fmt(b['load_s']):>7} {_fmt(b['ready_s']):>8}"
        )
    ratio, overhead, targets, met = result["ratio"], result["overhead_ratio"], result["targets"], result["met"]
    print(
        f"model {result['model']} ({result['artifact']}); healthz floor {_fmt(result['healthz_floor_s'])} s\n"
        f"ratio (warm/cold) {'-' if ratio is None else f'{ratio:.3f}'} (target <= {targets['ratio']}) "
        f"{'met' if met['ratio'] else 'MISSED'}\n"
        f"floor ({FLOOR_CODE}) {_fmt(result['floor_s'])} s; overhead (warm/floor) "
        f"{'-' if overhead is None else f'{overhead:.2f}'} (target <= {targets['overhead_ratio']}) "
        f"{'met' if met['overhead_ratio'] else 'MISSED'}\n"
        + _size_lines(result)
        + f"cpu flags: {' '.join(result['cpu_flags'])}; {result['machine']}"
        + (f"\nerrors: {result['errors']}" if result["errors"] else "")
    )


def _size_lines(result: dict[str, Any]) -> str:
    """The size section's line: warm ready of each model, with and without the records."""
    if "small" not in result["size"]:
        return "size section skipped (--big-mb 0)\n"
    ratio, before = result["big_over_small"], result["big_over_small_rehash"]
    return (
        f"warm ready, {result['big_mb']} MiB table {_fmt(result['big_warm_ready_s'])} s / digits "
        f"{_fmt(result['small_warm_ready_s'])} s = {'-' if ratio is None else f'{ratio:.2f}'} "
        f"(target <= {result['targets']['big_over_small']}) {'met' if result['met']['big_over_small'] else 'MISSED'};"
        f" re-hashing every start: {_fmt(result['big_warm_rehash_ready_s'])} s / "
        f"{_fmt(result['small_warm_rehash_ready_s'])} s = {'-' if before is None else f'{before:.2f}'}\n"
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.warm_start", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--model", choices=("bench", "digits"), default="bench")
    p.add_argument("--width", type=int, default=2048, help="bench model width")
    p.add_argument("--layers", type=int, default=7, help="bench model hidden layers")
    p.add_argument("--repeats", type=int, default=3, help="cold + warm pairs (medians are reported)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per start, until the model must be served")
    p.add_argument(
        "--big-mb",
        type=int,
        default=2048,
        help="size section: the big model's MiB (a random embedding table); 0 skips the section",
    )
    p.add_argument(
        "--big-timeout-s",
        type=float,
        default=900.0,
        help="size section: cold start of each model, until served (the big one is fetched and assembled)",
    )
    p.add_argument("--require-int8", action="store_true", help="fail (exit 3) unless central serves INT8")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for the edges")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON (exit 1 if a start never served)."""
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.timeout_s <= 0 or args.big_timeout_s <= 0 or args.big_mb < 0:
        print("--repeats, --timeout-s and --big-timeout-s must be positive, --big-mb not negative", file=sys.stderr)
        return 2
    try:
        with sigterm_raises():
            result = run(args)
    except Int8Required as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
