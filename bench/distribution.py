"""Distribution benchmark: how much central sends, and how fast a fleet gets a model.

Three fresh fleets of real processes on loopback, all with central's chunk egress
capped at ``--egress-mb-s`` (token bucket), each pushed the same generated model:

* ``placement``: placement on, ``--edges`` edges (each chunk: first owner from
  central, everybody else from owners);
* ``naive``: ``MODELFLEET_PLACEMENT__ENABLED=false``, ``--edges`` edges, every edge
  fetches every chunk from central;
* ``single``: placement on, one edge (the best a lone edge can do under the cap).

``rollout_s`` runs from the push's 201 to the last edge's ``completed_at``;
``origin_bytes`` is central's ``origin.bytes_sent``. Targets: ``origin_ratio`` (origin
bytes / model bytes) <= 1.10 and ``rollout_s <= 1.5 × single_edge_rollout_s``.
Every edge's assembled file is checked byte for byte (sha256) against the pushed one.

Usage: ``python -m bench.distribution --edges 8 --json out.json [--model-mb 40]
[--egress-mb-s 20] [--chunk-avg-kb 1024] [--edge-env K=V ...] [--central-env K=V ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._fleet import (
    Fleet,
    cached_mlp,
    chunking_env,
    model_cache_dir,
    parse_env_pairs,
    plan_mlp,
    sigterm_raises,
)

TARGETS = {"origin_ratio": 1.10, "rollout_over_single": 1.5}
MODEL_NAME = "bench-mlp"
VERSION = "v1"


def run_fleet(
    label: str,
    *,
    edges: int,
    model: Path,
    central_env: dict[str, str],
    edge_env: dict[str, str],
    work_dir: Path,
    timeout_s: float,
    keep: bool = False,
) -> dict[str, Any]:
    """One fresh fleet: start, push, wait for every edge, collect the figures."""
    with Fleet(root=work_dir, central_env=central_env, edge_env=edge_env, keep=keep) as fleet:
        fleet.start(edges)
        cpu_before = fleet.cpu_seconds()
        pushed = fleet.push(MODEL_NAME, VERSION, model)
        done = fleet.wait_complete(MODEL_NAME, VERSION, timeout_s=timeout_s)
        cpu_after = fleet.cpu_seconds()
        stats = fleet.stats()
        statuses = fleet.statuses()
        verified = fleet.verify_files(MODEL_NAME, VERSION, pushed.sha256)
    last = max(c.completed_at for c in done.values())
    # CPU each process used from just before the push to the last completion (Linux only).
    cpu = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in cpu_after.items()}
    per_edge = {}
    for node_id, status in statuses.items():
        f = status["fetch"]
        per_edge[node_id] = {
            "completed_after_s": done[node_id].completed_at - pushed.acked_at,
            "bytes_from_origin": f["bytes_from_origin"],
            "bytes_from_peers": f["bytes_from_peers"],
            "chunks_from_origin": f["chunks_from_origin"],
            "chunks_from_peers": f["chunks_from_peers"],
            "origin_refusals": f["origin_refusals"],
            "peer_errors": f["peer_errors"],
            "rejected_corrupt": f["rejected_corrupt"],
            "failures": f["failures"],
            "bytes_served_to_peers": status["peer"]["bytes_served"],
            "file_verified": verified[node_id],
            "cpu_s": cpu.get(node_id),
        }
    origin = stats["origin"]
    return {
        "label": label,
        "edges": edges,
        "model_bytes": pushed.size,
        "chunks": len(pushed.manifest["chunks"]),
        "push_s": pushed.acked_at - pushed.started_at,
        "rollout_s": last - pushed.acked_at,
        "rollout_observed_s": max(c.observed_at for c in done.values()) - pushed.acked_at,
        "origin_bytes": origin["bytes_sent"],
        "origin_ratio": origin["bytes_sent"] / pushed.size,
        "origin_chunks_sent": origin["chunks_sent"],
        "origin_refused": origin["refused"],
        "all_files_verified": all(verified.values()),
        "central_cpu_s": cpu.get("central"),
        "edges_cpu_s": round(sum(v for k, v in cpu.items() if k != "central"), 3),
        "per_edge": per_edge,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Generate the model, run the three fleets and summarise against the targets."""
    width, layers = plan_mlp(int(args.model_mb * 1e6))
    model = cached_mlp(model_cache_dir(args.model_cache), width=width, hidden_layers=layers)
    model_bytes = model.stat().st_size
    cap = int(args.egress_mb_s * 1e6)
    central_env = {
        "MODELFLEET_ORIGIN__EGRESS_BYTES_S": str(cap),
        # Distribution of the uploaded bytes is what is measured; quantizing a random
        # MLP would only add push time (and its guard refuses such models).
        "MODELFLEET_QUANTIZE__ENABLED": "false",
        **chunking_env(args.chunk_avg_kb),
        **parse_env_pairs(args.central_env),
    }
    edge_env = parse_env_pairs(args.edge_env)
    # Generous: the naive fleet needs edges × model / cap at least.
    timeout_s = args.timeout_s or max(60.0, 10.0 * args.edges * model_bytes / cap)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    print(
        f"model {model.name}: {model_bytes / 1e6:.1f} MB (width {width}, {layers} hidden layers); "
        f"egress cap {cap / 1e6:.1f} MB/s; chunks ~{args.chunk_avg_kb} KiB; {args.edges} edges; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    common: dict[str, Any] = {"model": model, "edge_env": edge_env, "work_dir": work, "timeout_s": timeout_s}
    common["keep"] = args.keep
    runs: dict[str, dict[str, Any]] = {}
    plans = [
        ("placement", args.edges, central_env),
        ("naive", args.edges, {**central_env, "MODELFLEET_PLACEMENT__ENABLED": "false"}),
        ("single", 1, central_env),
    ]
    for label, edges, env in plans:
        print(f"running {label} ({edges} edge{'s' if edges != 1 else ''}) ...", flush=True)
        runs[label] = run_fleet(label, edges=edges, central_env=env, **common)
        r = runs[label]
        print(f"  rollout {r['rollout_s']:.2f}s, origin {r['origin_bytes'] / 1e6:.1f} MB", flush=True)
    a, b, c = runs["placement"], runs["naive"], runs["single"]
    rollout_over_single = a["rollout_s"] / c["rollout_s"] if c["rollout_s"] > 0 else float("inf")
    all_verified = all(r["all_files_verified"] for r in runs.values())
    return {
        "edges": args.edges,
        "model_bytes": model_bytes,
        "origin_bytes": a["origin_bytes"],
        "origin_ratio": a["origin_ratio"],
        "naive_origin_bytes": b["origin_bytes"],
        "naive_origin_ratio": b["origin_ratio"],
        "single_edge_origin_ratio": c["origin_ratio"],
        "rollout_s": a["rollout_s"],
        "naive_rollout_s": b["rollout_s"],
        "single_edge_rollout_s": c["rollout_s"],
        "rollout_over_single": rollout_over_single,
        "ideal_single_edge_rollout_s": model_bytes / cap,
        "egress_cap_bytes_s": cap,
        "targets": dict(TARGETS),
        "met": {
            "origin_ratio": a["origin_ratio"] <= TARGETS["origin_ratio"],
            "rollout_over_single": rollout_over_single <= TARGETS["rollout_over_single"],
            "files_verified": all_verified,
        },
        "all_files_verified": all_verified,
        "settings": {
            "model_file": model.name,
            "width": width,
            "hidden_layers": layers,
            "chunk_avg_kb": args.chunk_avg_kb,
            "central_env": central_env,
            "edge_env": edge_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "runs": runs,
    }


def _print_table(result: dict[str, Any]) -> None:
    header = (
        f"{'fleet':<10} {'edges':>5} {'chunks':>6} {'rollout s':>9} {'origin MB':>9} "
        f"{'origin/model':>12} {'verified':>8} {'CPU s':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in result["runs"].values():
        print(
            f"{r['label']:<10} {r['edges']:>5} {r['chunks']:>6} {r['rollout_s']:>9.2f} "
            f"{r['origin_bytes'] / 1e6:>9.1f} {r['origin_ratio']:>12.3f} {r['all_files_verified']!s:>8} "
            f"{(r['central_cpu_s'] or 0) + r['edges_cpu_s']:>6.2f}"
        )
    t = result["targets"]
    print(
        f"model {result['model_bytes'] / 1e6:.1f} MB, cap {result['egress_cap_bytes_s'] / 1e6:.1f} MB/s "
        f"(ideal single edge {result['ideal_single_edge_rollout_s']:.2f}s)\n"
        f"origin_ratio {result['origin_ratio']:.3f} (target <= {t['origin_ratio']}), "
        f"rollout/single {result['rollout_over_single']:.2f} (target <= {t['rollout_over_single']}), "
        f"naive origin_ratio {result['naive_origin_ratio']:.2f}, met={result['met']}"
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.distribution", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--edges", type=int, default=8, help="edges of the placement and naive fleets")
    p.add_argument("--model-mb", type=float, default=40.0, help="model size, at least this many MB (1e6 bytes)")
    p.add_argument("--egress-mb-s", type=float, default=20.0, help="central's egress cap in MB/s (1e6 bytes/s)")
    p.add_argument("--chunk-avg-kb", type=int, default=1024, help="average chunk size in KiB (min avg/4, max avg×4)")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for every edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--timeout-s", type=float, default=0.0, help="per-fleet rollout timeout (0: from size and cap)")
    p.add_argument("--work-dir", type=Path, default=None, help="where fleet temp dirs go (default: system temp)")
    p.add_argument("--model-cache", type=Path, default=None, help="generated models are kept here")
    p.add_argument("--keep", action="store_true", help="keep the fleets' data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    if args.edges < 1 or args.model_mb <= 0 or args.egress_mb_s <= 0:
        print("--edges, --model-mb and --egress-mb-s must be positive", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
    _print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
