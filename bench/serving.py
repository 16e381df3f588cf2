"""Serving benchmark: what dynamic batching buys, and how close inference gets to the HTTP ceiling.

One central and one edge, real processes on loopback; the load comes from another
process (``bench.loadgen``: wrk when installed, else an asyncio client), ``--clients``
keep-alive connections sending requests back to back. Every request is one row
(batch 1), as JSON (OIP v2). Each measured run follows a warm-up run.

1. The benchmark MLP (``modelfleet.zoo.build_bench_model``, pushed with its calibration
   file so central serves INT8 once quantization is wired) on an edge with batching on
   (defaults: up to 32 rows, 5 ms delay): ``batched_rps``, ``p50_ms``, ``p99_ms``, and
   ``mean_batch_size`` from the edge's ``modelfleet_inference_batch_size`` histogram
   (delta over the run). Then a fresh edge with ``MAX_BATCH_SIZE=1`` (the first one
   stopped, so they never share the CPU): ``unbatched_rps``; ``speedup`` = their ratio.
2. The digits classifier (INT8 likewise) on the first edge, batching on, against
   ``POST /bench/noop`` there with the same body (the HTTP stack's ceiling: it reads the
   body and answers a fixed document): ``digits_rps``, ``noop_rps``, ``ceiling_ratio``. The
   edge answers both through the same raw ASGI fast path, so the ratio is like for like.
3. The compute limit: ONNX Runtime in this process, on the very model file the first edge
   served (bench-mlp, its INT8 artifact when central quantized it), with the edge's session
   options (``SessionFactory``: all cores, no spinning), at the edge's largest batch (32
   rows), for ~2 s once the first edge has stopped, so nothing else runs:
   ``compute_limit_rps`` (rows/s) and ``compute_ratio`` = ``batched_rps`` / it, how much of
   what the model could compute the served edge delivers over HTTP.

Every run also records the edge's CPU time per request (all threads, and its event-loop
thread alone, from /proc), the mean rows and ONNX Runtime seconds per executed batch
(``modelfleet_inference_seconds``), and the load generator's own CPU time, so a missed
target can be attributed. Which artifact each model was served as (``fp32`` or an INT8 recipe, ``int8-…``,
from central's manifest) is printed and stored; ``--require-int8`` makes a non-INT8
artifact an error (exit 3) instead of a note.

4. KServe v2 gRPC on the first edge (its ``infer_grpc_port``), the same rows as raw input
   contents, ``--clients`` calls in flight from ``bench.grpc_loadgen`` (grpc.aio in its own
   process, 8 channels; no ``ghz`` package exists here): ``grpc_batched_rps``,
   ``grpc_digits_rps``, and ``grpc_over_rest`` = ``grpc_batched_rps`` / ``batched_rps``
   (``grpc_digits_over_rest`` likewise). The two load generators differ (wrk is C; the gRPC
   client is Python and costs the shared cores more), which these ratios include.

5. With ``--shadow``: the cost of checking INT8 on live traffic (``edge_node.inference.shadow``).
   Fresh edges, one at a time, serve bench-mlp batched with shadow sampling off
   (``MODELFLEET_INFERENCE__SHADOW_SAMPLE=0``) and at the default 1 %, alternating
   ``--shadow-rounds`` times, artifact timing off so both serve central's INT8:
   ``shadow_off_rps`` and ``shadow_rps`` (medians), ``shadow_cost`` = 1 - ``shadow_rps`` /
   ``shadow_off_rps`` (target <= 0.03), ``shadow_cpu_cost`` = the edge's CPU per request with
   sampling over without, - 1 (medians; steadier than req/s on a shared machine), and ``shadow``
   (the edge's sampled counts after its last run). The other runs use the edges' default (1 %) too.

Targets: ``speedup >= 3.0``, ``ceiling_ratio >= 0.6``, ``compute_ratio >= 0.6``,
``grpc_over_rest >= 1.0``, ``errors == 0``.

Usage: ``python -m bench.serving --clients 64 --json out.json [--duration-s 5]
[--requests-per-client N] [--width 2048 --layers 7] [--load-generator auto|wrk|python]
[--require-int8] [--shadow [--shadow-rounds N]] [--edge-env K=V ...] [--central-env K=V ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench._fleet import RANDOM_MODEL_THRESHOLD, Fleet, parse_env_pairs, sigterm_raises
from bench.grpc_loadgen import METHOD as GRPC_METHOD
from bench.grpc_loadgen import run_grpc_load
from bench.loadgen import run_load, wrk_path
from edge_node.inference.session import SessionFactory, session_specs
from edge_node.settings import InferenceSettings
from fleetwire.kserve import grpc_predict_v2_pb2 as kserve
from modelfleet.zoo import build_bench_model, build_digits

TARGETS = {"speedup": 3.0, "ceiling_ratio": 0.6, "compute_ratio": 0.6, "grpc_over_rest": 1.0, "errors": 0}
BENCH_MODEL = "bench-mlp"
DIGITS_MODEL = "digits"
VERSION = "v1"
BATCHED_NODE = "e0"
UNBATCHED_NODE = "e1"
#: The edge's default ``inference.batching.max_batch_size``: the compute limit's batch.
EDGE_MAX_BATCH = 32
COMPUTE_SECONDS = 2.0
#: The edge's default share of an INT8 version's requests checked against FP32.
DEFAULT_SHADOW_SAMPLE = InferenceSettings().shadow_sample
#: ``shadow_cost`` at most this (``--shadow``).
SHADOW_COST_TARGET = 0.03
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# -- edge-side figures -------------------------------------------------------------------


def metric_total(text: str, name: str, model: str) -> float:
    """Sum of the ``name`` samples whose ``model`` label is ``model`` (over versions)."""
    total = 0.0
    for m in _SAMPLE.finditer(text):
        if m["name"] == name and dict(_LABEL.findall(m["labels"])).get("model") == model:
            total += float(m["value"])
    return total


def batch_figures(text: str, model: str) -> dict[str, float]:
    """Cumulative batch counters of ``model``: batches, rows, ORT seconds."""
    return {
        "batches": metric_total(text, "modelfleet_inference_batch_size_count", model),
        "rows": metric_total(text, "modelfleet_inference_batch_size_sum", model),
        "ort_s": metric_total(text, "modelfleet_inference_seconds_sum", model),
    }


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every thread of ``pid``; {} off Linux."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def grpc_infer_request(model: str, input_name: str, row: np.ndarray) -> bytes:
    """A serialized KServe v2 ``ModelInferRequest`` with one FP32 row as raw input contents."""
    request = kserve.ModelInferRequest(model_name=model)
    request.inputs.add(name=input_name, datatype="FP32", shape=[1, int(row.size)])
    request.raw_input_contents.append(np.ascontiguousarray(row, dtype="<f4").tobytes())
    return request.SerializeToString()


def infer_body(input_name: str, row: np.ndarray) -> bytes:
    """An OIP v2 JSON request with one FP32 row."""
    data = [round(float(x), 4) for x in row.ravel()]
    doc = {"inputs": [{"name": input_name, "datatype": "FP32", "shape": [1, int(row.size)], "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def compute_limit(model_path: Path, batch: int = EDGE_MAX_BATCH, seconds: float = COMPUTE_SECONDS) -> dict[str, Any]:
    """Rows/s ONNX Runtime gives on ``model_path`` in this process at ``batch`` rows per run,
    with the session options an edge uses (``SessionFactory`` with its default threads), over
    ``seconds`` after a warm-up: what no server of this model can beat on this machine."""
    with tempfile.TemporaryDirectory() as cache:
        session = SessionFactory(Path(cache), ["CPUExecutionProvider"]).create(model_path, "compute-limit")
    rng = np.random.default_rng(0)
    inputs = {
        spec.name: rng.standard_normal([batch] + [d if d > 0 else 1 for d in spec.shape[1:]]).astype(spec.dtype)
        for spec in session_specs(session)[0]
    }
    for _ in range(3):
        session.run(None, inputs)
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        session.run(None, inputs)
        runs += 1
    return {
        "model_bytes": model_path.stat().st_size,
        "batch": batch,
        "runs": runs,
        "ms_per_batch": 1e3 * elapsed / runs,
        "rows_per_s": runs * batch / elapsed,
    }


# -- runs --------------------------------------------------------------------------------


class Runner:
    """Warm-up plus measured load runs against one fleet, with the edge-side figures."""

    def __init__(self, fleet: Fleet, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.args = args
        self.log = log
        self.warmup_errors = 0

    def _load(self, url: str, body: bytes, duration_s: float, requests: int | None) -> dict[str, Any]:
        return run_load(
            url,
            body,
            connections=self.args.clients,
            duration_s=duration_s,
            requests_per_connection=requests,
            tool=self.args.load_generator,
            threads=self.args.wrk_threads,
        )

    def measure(self, label: str, node_id: str, path: str, body: bytes, model: str | None) -> dict[str, Any]:
        """One warm-up and one measured REST run of ``path`` on ``node_id``."""
        url = self.fleet.edges[node_id].http_url + path
        described = {"transport": "rest", "path": path, "body_bytes": len(body)}
        return self._measure(label, node_id, model, lambda s, n: self._load(url, body, s, n), described)

    def measure_grpc(self, label: str, node_id: str, request: bytes, model: str) -> dict[str, Any]:
        """One warm-up and one measured KServe v2 gRPC run (``ModelInfer``, serialized
        ``request``) on ``node_id``'s inference gRPC port, ``--clients`` calls in flight."""
        target = self.fleet.edges[node_id].infer_grpc_address
        if not target:
            raise RuntimeError(f"edge {node_id} serves no KServe v2 gRPC (infer_grpc_port off?)")
        clients = self.args.clients

        def load(seconds: float, _: int | None) -> dict[str, Any]:
            return run_grpc_load(target, request, concurrency=clients, duration_s=seconds)

        described = {"transport": "grpc", "path": GRPC_METHOD, "body_bytes": len(request)}
        return self._measure(label, node_id, model, load, described)

    def _measure(
        self,
        label: str,
        node_id: str,
        model: str | None,
        load: Callable[[float, int | None], dict[str, Any]],
        described: dict[str, Any],
    ) -> dict[str, Any]:
        fleet, args = self.fleet, self.args
        if args.warmup_s > 0:
            warm_requests = max(1, args.requests_per_client // 4) if args.requests_per_client else None
            warm = load(args.warmup_s, warm_requests)
            self.warmup_errors += warm["errors"]
        pid = fleet.edges[node_id].popen.pid
        before_metrics = batch_figures(fleet.edge_metrics(node_id), model) if model else None
        cpu_before, threads_before = fleet.cpu_seconds().get(node_id, 0.0), thread_cpu_s(pid)
        result = load(args.duration_s, args.requests_per_client)
        cpu_after, threads_after = fleet.cpu_seconds().get(node_id, 0.0), thread_cpu_s(pid)
        run: dict[str, Any] = {"label": label, "node": node_id, **described, **result}
        n = max(1, result["requests"])
        run["edge_cpu_s"] = round(cpu_after - cpu_before, 3)
        run["edge_cpu_ms_per_request"] = 1e3 * (cpu_after - cpu_before) / n
        loop_s = threads_after.get(pid, 0.0) - threads_before.get(pid, 0.0)  # main thread: the event loop
        run["edge_loop_cpu_ms_per_request"] = 1e3 * loop_s / n
        run["edge_other_threads_cpu_ms_per_request"] = (
            run["edge_cpu_ms_per_request"] - run["edge_loop_cpu_ms_per_request"]
        )
        run["edge_cpu_cores_busy"] = (cpu_after - cpu_before) / result["seconds"] if result["seconds"] else 0.0
        if model and before_metrics is not None:
            after = batch_figures(fleet.edge_metrics(node_id), model)
            batches = after["batches"] - before_metrics["batches"]
            rows = after["rows"] - before_metrics["rows"]
            ort_s = after["ort_s"] - before_metrics["ort_s"]
            run["batches"] = int(batches)
            run["mean_batch_size"] = rows / batches if batches else 0.0
            run["ort_ms_per_batch"] = 1e3 * ort_s / batches if batches else 0.0
            run["ort_busy_share"] = ort_s / result["seconds"] if result["seconds"] else 0.0
        self.log(
            f"  {label:<10} {result['rps']:>9.1f} req/s  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms"
            f"  errors {result['errors']}  edge CPU {run['edge_cpu_ms_per_request']:.3f} ms/req"
            + (f"  batch {run['mean_batch_size']:.1f}" if "mean_batch_size" in run else "")
        )
        return run


def measure_shadow(runner: Runner, path: str, body: bytes, rounds: int) -> dict[str, Any]:
    """bench-mlp on fresh batched edges, shadow sampling off and at the default, alternating
    ``rounds`` times, each edge alone on the machine: the figures ``--shadow`` adds."""
    fleet = runner.fleet
    on: list[dict[str, Any]] = []
    off: list[dict[str, Any]] = []
    shadow: dict[str, Any] | None = None
    for i in range(rounds):
        for sample, kept in ((0.0, off), (DEFAULT_SHADOW_SAMPLE, on)):
            node = f"s{2 * i + (sample > 0)}"
            # Timing off: both serve central's default, the INT8 artifact (timing may pick FP32 at small sizes).
            env = {"MODELFLEET_INFERENCE__SHADOW_SAMPLE": str(sample), "MODELFLEET_INFERENCE__CHOICE__ENABLED": "false"}
            fleet.start_edge(node, env=env)
            fleet.wait_model_ready(node, BENCH_MODEL, timeout_s=runner.args.timeout_s)
            kept.append(runner.measure("shadow_on" if sample else "shadow_off", node, path, body, BENCH_MODEL))
            if sample:
                shadow = fleet.edge_status(node)["shadow"].get(f"{BENCH_MODEL}:{VERSION}")
            fleet.stop_edge(node)
    on_rps = float(np.median([r["rps"] for r in on]))
    off_rps = float(np.median([r["rps"] for r in off]))
    cost = 1.0 - on_rps / off_rps if off_rps else 0.0
    # The edge's CPU per request: what sampling adds, less moved by other load on the machine than req/s.
    on_cpu = float(np.median([r["edge_cpu_ms_per_request"] for r in on]))
    off_cpu = float(np.median([r["edge_cpu_ms_per_request"] for r in off]))
    runner.log(
        f"  shadow     {DEFAULT_SHADOW_SAMPLE:.0%} sampled {on_rps:.1f} req/s, off {off_rps:.1f}: cost {cost:.3f}"
    )
    return {
        "shadow_rps": on_rps,
        "shadow_off_rps": off_rps,
        "shadow_cost": cost,
        "shadow_cpu_ms_per_request": on_cpu,
        "shadow_off_cpu_ms_per_request": off_cpu,
        "shadow_cpu_cost": on_cpu / off_cpu - 1.0 if off_cpu else 0.0,
        "shadow_sample": DEFAULT_SHADOW_SAMPLE,
        "shadow_target": SHADOW_COST_TARGET,
        "shadow_met": cost <= SHADOW_COST_TARGET,
        "shadow": shadow,
        "shadow_runs": {"on": on, "off": off},
    }


def _artifact(fleet: Fleet, name: str) -> dict[str, Any]:
    manifest = fleet.manifest(name, VERSION)
    return {"artifact": manifest.get("artifact"), "quantization": manifest.get("quantization")}


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the models, run the fleet and the five measured runs, summarise against the targets."""
    bench = build_bench_model(width=args.width, hidden_layers=args.layers)
    digits = build_digits()
    rng = np.random.default_rng(0)
    bench_body = infer_body(bench.input_name, rng.standard_normal(bench.width).astype(np.float32))
    digits_body = infer_body(digits.input_name, digits.test_x[0])
    bench_row = rng.standard_normal(bench.width).astype(np.float32)
    bench_grpc = grpc_infer_request(BENCH_MODEL, bench.input_name, bench_row)
    digits_grpc = grpc_infer_request(DIGITS_MODEL, digits.input_name, digits.test_x[0])
    tool = args.load_generator if args.load_generator != "auto" else ("wrk" if wrk_path() else "python")
    edge_env = {"MODELFLEET_INFERENCE__BENCH_ENDPOINTS": "true", **parse_env_pairs(args.edge_env)}
    central_env = parse_env_pairs(args.central_env)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    log(
        f"bench model {bench.onnx_path.stat().st_size / 1e6:.1f} MB FP32 (width {bench.width}, {args.layers} layers); "
        f"{args.clients} clients; load generator {tool}; {os.cpu_count()} CPUs"
    )
    runs: dict[str, dict[str, Any]] = {}
    with Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
        fleet.start_central()
        fleet.start_edge(BATCHED_NODE)
        fleet.wait_registered()
        started = time.monotonic()
        fleet.push_files(
            BENCH_MODEL, VERSION, bench.onnx_path, calibration=bench.calibration_path, threshold=RANDOM_MODEL_THRESHOLD
        )
        fleet.push_files(DIGITS_MODEL, VERSION, digits.onnx_path, calibration=digits.calibration_path)
        pushed_s = time.monotonic() - started
        artifacts = {BENCH_MODEL: _artifact(fleet, BENCH_MODEL), DIGITS_MODEL: _artifact(fleet, DIGITS_MODEL)}
        log(
            f"pushed in {pushed_s:.1f}s; served artifacts: "
            + ", ".join(f"{k} {v['artifact']}" for k, v in artifacts.items())
        )
        not_int8 = [k for k, v in artifacts.items() if not str(v["artifact"]).startswith("int8")]
        if not_int8 and args.require_int8:
            raise Int8Required(f"--require-int8: central serves {', '.join(not_int8)} as non-INT8: {artifacts}")
        for model in (BENCH_MODEL, DIGITS_MODEL):
            fleet.wait_model_ready(BATCHED_NODE, model, timeout_s=args.timeout_s)
        runner = Runner(fleet, args, log)
        path_bench = f"/v2/models/{BENCH_MODEL}/infer"
        runs["batched"] = runner.measure("batched", BATCHED_NODE, path_bench, bench_body, BENCH_MODEL)
        runs["digits"] = runner.measure(
            "digits", BATCHED_NODE, f"/v2/models/{DIGITS_MODEL}/infer", digits_body, DIGITS_MODEL
        )
        runs["noop"] = runner.measure("noop", BATCHED_NODE, "/bench/noop", digits_body, None)
        runs["grpc_batched"] = runner.measure_grpc("grpc_batched", BATCHED_NODE, bench_grpc, BENCH_MODEL)
        runs["grpc_digits"] = runner.measure_grpc("grpc_digits", BATCHED_NODE, digits_grpc, DIGITS_MODEL)
        served_file = fleet.model_file(BATCHED_NODE, BENCH_MODEL, VERSION)
        fleet.stop_edge(BATCHED_NODE)
        compute = compute_limit(served_file)  # no edge runs now: ORT alone on the machine
        log(f"  compute    {compute['rows_per_s']:>9.1f} rows/s  ONNX Runtime in-process, batch {compute['batch']}")
        fleet.start_edge(UNBATCHED_NODE, env={"MODELFLEET_INFERENCE__BATCHING__MAX_BATCH_SIZE": "1"})
        fleet.wait_model_ready(UNBATCHED_NODE, BENCH_MODEL, timeout_s=args.timeout_s)
        runs["unbatched"] = runner.measure("unbatched", UNBATCHED_NODE, path_bench, bench_body, BENCH_MODEL)
        fleet.stop_edge(UNBATCHED_NODE)
        shadow = measure_shadow(runner, path_bench, bench_body, args.shadow_rounds) if args.shadow else {}
        warmup_errors = runner.warmup_errors
    b, u, d, n = runs["batched"], runs["unbatched"], runs["digits"], runs["noop"]
    gb, gd = runs["grpc_batched"], runs["grpc_digits"]
    grpc_over_rest = gb["rps"] / b["rps"] if b["rps"] else 0.0
    speedup = b["rps"] / u["rps"] if u["rps"] else 0.0
    ceiling_ratio = d["rps"] / n["rps"] if n["rps"] else 0.0
    compute_limit_rps = compute["rows_per_s"]
    compute_ratio = b["rps"] / compute_limit_rps if compute_limit_rps else 0.0
    errors = sum(r["errors"] for r in runs.values())
    errors += sum(r["errors"] for kept in shadow.get("shadow_runs", {}).values() for r in kept)
    return {
        "clients": args.clients,
        "load_generator": tool,
        "duration_s": args.duration_s if tool == "wrk" or not args.requests_per_client else None,
        "requests_per_client": args.requests_per_client if tool == "python" else None,
        "batched_rps": b["rps"],
        "grpc_batched_rps": gb["rps"],
        "grpc_digits_rps": gd["rps"],
        "grpc_over_rest": grpc_over_rest,
        "grpc_digits_over_rest": gd["rps"] / d["rps"] if d["rps"] else 0.0,
        "grpc_p99_ms": gb["p99_ms"],
        "unbatched_rps": u["rps"],
        "speedup": speedup,
        "p50_ms": b["p50_ms"],
        "p99_ms": b["p99_ms"],
        "unbatched_p50_ms": u["p50_ms"],
        "unbatched_p99_ms": u["p99_ms"],
        "mean_batch_size": b.get("mean_batch_size", 0.0),
        "unbatched_mean_batch_size": u.get("mean_batch_size", 0.0),
        "digits_rps": d["rps"],
        "noop_rps": n["rps"],
        "ceiling_ratio": ceiling_ratio,
        "compute_limit_rps": compute_limit_rps,
        "compute_ratio": compute_ratio,
        "compute": compute,
        "digits_p50_ms": d["p50_ms"],
        "digits_p99_ms": d["p99_ms"],
        "errors": errors,
        "warmup_errors": warmup_errors,
        "artifacts": {k: v["artifact"] for k, v in artifacts.items()},
        "quantization": {k: v["quantization"] for k, v in artifacts.items()},
        "targets": dict(TARGETS),
        "met": {
            "speedup": speedup >= TARGETS["speedup"],
            "ceiling_ratio": ceiling_ratio >= TARGETS["ceiling_ratio"],
            "compute_ratio": compute_ratio >= TARGETS["compute_ratio"],
            "grpc_over_rest": grpc_over_rest >= TARGETS["grpc_over_rest"],
            "errors": errors <= TARGETS["errors"],
        },
        "settings": {
            "width": bench.width,
            "layers": args.layers,
            "bench_model_bytes": bench.onnx_path.stat().st_size,
            "bench_body_bytes": len(bench_body),
            "digits_body_bytes": len(digits_body),
            "warmup_s": args.warmup_s,
            "edge_env": edge_env,
            "central_env": central_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "runs": runs,
        **shadow,
    }


class Int8Required(RuntimeError):
    """``--require-int8`` and central served a model as something else."""


def print_table(result: dict[str, Any]) -> None:
    """The runs, then the figures against the targets."""
    header = (
        f"{'run':<10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'batch':>6} {'ORT ms':>7} "
        f"{'edge CPU ms/req':>15} {'loop ms/req':>11} {'gen CPU s':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in result["runs"].values():
        batch = f"{r['mean_batch_size']:.1f}" if "mean_batch_size" in r else "-"
        ort = f"{r['ort_ms_per_batch']:.2f}" if "ort_ms_per_batch" in r else "-"
        print(
            f"{r['label']:<10} {r['rps']:>9.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>6} {batch:>6} "
            f"{ort:>7} {r['edge_cpu_ms_per_request']:>15.3f} {r['edge_loop_cpu_ms_per_request']:>11.3f} "
            f"{r['cpu_s']:>9.2f}"
        )
    t, m = result["targets"], result["met"]
    print(
        f"artifacts: {result['artifacts']}; load generator {result['load_generator']}, {result['clients']} clients\n"
        f"speedup (batched/unbatched) {result['speedup']:.2f} (target >= {t['speedup']}) "
        f"{'met' if m['speedup'] else 'MISSED'}; mean batch {result['mean_batch_size']:.1f}\n"
        f"ceiling_ratio (digits/noop) {result['ceiling_ratio']:.2f} (target >= {t['ceiling_ratio']}) "
        f"{'met' if m['ceiling_ratio'] else 'MISSED'}\n"
        f"compute_ratio (batched/ONNX Runtime alone, {result['compute_limit_rps']:.0f} rows/s) "
        f"{result['compute_ratio']:.2f} (target >= {t['compute_ratio']}) {'met' if m['compute_ratio'] else 'MISSED'}\n"
        f"grpc_over_rest (gRPC/REST, batched model; digits {result['grpc_digits_over_rest']:.2f}) "
        f"{result['grpc_over_rest']:.2f} (target >= {t['grpc_over_rest']}) "
        f"{'met' if m['grpc_over_rest'] else 'MISSED'}\n"
        f"errors {result['errors']} (target {t['errors']}) {'met' if m['errors'] else 'MISSED'}"
    )
    if "shadow_cost" in result:
        print(
            f"shadow_cost (1 - {result['shadow_sample']:.0%} sampled/off, {result['shadow_rps']:.1f} vs"
            f" {result['shadow_off_rps']:.1f} req/s) {result['shadow_cost']:.3f} (target <= {result['shadow_target']})"
            f" {'met' if result['shadow_met'] else 'MISSED'}; edge CPU per request"
            f" {result['shadow_cpu_cost']:+.3f}; sampled {result['shadow']}"
        )


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--clients", type=int, default=64, help="concurrent keep-alive connections")
    p.add_argument("--duration-s", type=float, default=5.0, help="length of each measured run (at most 30)")
    p.add_argument("--warmup-s", type=float, default=2.0, help="length of the warm-up before each run (0: none)")
    p.add_argument(
        "--requests-per-client", type=int, default=None,
        help="python load generator: requests per connection (the run still ends after --duration-s); "
        "wrk runs by duration only",
    )  # fmt: skip
    p.add_argument("--width", type=int, default=2048, help="bench model width")
    p.add_argument("--layers", type=int, default=7, help="bench model hidden layers")
    p.add_argument("--load-generator", choices=("auto", "wrk", "python"), default="auto")
    p.add_argument("--wrk-threads", type=int, default=None, help="wrk threads (default: cores/4, at least 1)")
    p.add_argument("--require-int8", action="store_true", help="fail (exit 3) unless both models are served INT8")
    p.add_argument("--shadow", action="store_true", help="also measure the cost of shadow sampling (see 5.)")
    p.add_argument("--shadow-rounds", type=int, default=1, help="--shadow: off/on pairs of runs (medians)")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for the edges")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long to wait for a model to be served")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    if (
        args.clients < 1
        or args.duration_s <= 0
        or (args.requests_per_client is not None and args.requests_per_client < 1)
    ):
        print("--clients, --duration-s and --requests-per-client must be positive", file=sys.stderr)
        return 2
    try:
        with sigterm_raises():
            result = run(args)
    except Int8Required as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
