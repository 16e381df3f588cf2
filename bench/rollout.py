"""Rollout benchmark (issue 16): staged flips, the cost preview, and INT8 drift under live traffic.

A real fleet (central, a private Mosquitto, ``--edges`` edge processes in two sites, heartbeats
on), three parts in turn on the same fleet:

1. **Flip skew.** v1 of an MLP everywhere; v2 pushed held back (``activate=false``) and rolled
   out staged (``stage: true``) until every node reports ``staged``; then flipped at an instant
   ``--flip-lead-s`` ahead. A thread per edge polls its OIP v2 inference from half a second
   before the instant and brackets when its answers turned to v2 (the edges run as
   processes, so their own ``switched_at`` is not reachable; ``flip_resolution_s`` is the
   widest bracket's half). ``flip_skew_s`` = last switch − first (target ≤ 0.5);
   ``flip_error_s`` = worst |switch − instant|. The clock offsets the edges measured against
   central (``/api/v1/status`` → ``clock``) are reported too (same host: near 0).
2. **Preview error.** A new version (every chunk new), then a delta (a new head only), each
   pushed held back, previewed (``POST …/rollouts?dry_run=true``), rolled out to everyone
   (canary 1.0, soak 0), and compared per node with each edge's own fetch counters.
   ``preview_error`` = worst relative error over nodes and both versions (target ≤ 0.05).
3. **INT8 drift.** ``modelfleet.zoo.drift``'s classifier, pushed with calibration data: its
   INT8 passes the guard and is served; live inputs from a shifted distribution (×10) make
   INT8 disagree with FP32 on most of them. Requests go round-robin to the edges until central
   raises ``int8_drift`` (``shadow_detect_requests``, target ≤ 2,000 at the edges' default 1 %
   shadow sample); ``fallback_s`` runs from that event to every edge serving ``fp32``
   (target ≤ 5). Without edge shadow sampling and central's judge (no ``int8_drift`` within
   ``--shadow-max-requests`` / ``--timeout-s``) the part says ``shadow_available: false`` and
   why; it does not fail the run.

Usage: ``python -m bench.rollout --json out.json [--edges 8] [--skip-shadow]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench._fleet import Fleet, FleetError, model_cache_dir, parse_env_pairs, sigterm_raises, write_result
from bench._rollout_parts import measure_flip, measure_preview, measure_shadow
from bench.failover import CHUNKING_ENV
from bench.zoo import cpu_flags
from modelfleet.up.children import ChildError
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker

TARGETS: dict[str, float] = {
    "flip_skew_s": 0.5,
    "preview_error": 0.05,
    "shadow_detect_requests": 2000,
    "fallback_s": 5.0,
}
SITES = ("s1", "s2")


def _fleet_env(args: argparse.Namespace, broker: MosquittoBroker) -> tuple[dict[str, str], dict[str, str]]:
    broker_env = {"MODELFLEET_BROKER__HOST": broker.host, "MODELFLEET_BROKER__PORT": str(broker.port)}
    central_env = {
        "MODELFLEET_MQTT__ENABLED": "true",
        "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": str(args.interval),
        "MODELFLEET_ROLLOUT__INTERVAL_S": "0.2",
        **broker_env,
        **CHUNKING_ENV,
        **parse_env_pairs(args.central_env),
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_HEARTBEAT__INTERVAL_S": str(args.interval),
        # Timing a version's artifacts is what edges do; a short budget keeps 8 of them on a
        # small machine from starving each other's heartbeats while they do.
        "MODELFLEET_INFERENCE__CHOICE__BUDGET_S": str(args.choice_budget_s),
        **broker_env,
        **parse_env_pairs(args.edge_env),
    }
    return central_env, edge_env


def _start(fleet: Fleet, edges: int) -> dict[str, str]:
    """Central, then the edges alternately in two sites; node → site."""
    fleet.start_central()
    sites = {f"e{i}": SITES[i % len(SITES)] for i in range(edges)}
    procs = [fleet.start_edge(n, env={"MODELFLEET_SITE": s}, wait_ready=False) for n, s in sites.items()]
    for proc in procs:
        fleet.wait_ready_line(proc)
    fleet.wait_registered()
    return sites


def _part(name: str, errors: list[str], measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One part's figures; a failure is recorded in ``errors`` and leaves the others running."""
    try:
        return measure()
    except (FleetError, ChildError, httpx.HTTPError, KeyError, ValueError, TimeoutError) as exc:
        errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:2000]}")
        return {}


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the fleet and measure each part in turn."""
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    models = model_cache_dir(args.model_cache)
    errors: list[str] = []
    figures: dict[str, Any] = {}
    with MosquittoBroker(log=BENCH_LOG) as broker:
        central_env, edge_env = _fleet_env(args, broker)
        with Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
            sites = _start(fleet, args.edges)
            log(f"fleet up: {args.edges} edges in {len(SITES)} sites")
            figures.update(
                _part("flip", errors, lambda: measure_flip(
                    fleet, models, width=args.flip_width, lead_s=args.flip_lead_s, timeout_s=args.timeout_s))
            )  # fmt: skip
            log(f"flip: skew {figures.get('flip_skew_s')} s, error {figures.get('flip_error_s')} s")
            if not args.skip_preview:
                figures.update(
                    _part("preview", errors, lambda: measure_preview(
                        fleet, models, width=args.width, layers=args.layers, interval_s=args.interval,
                        timeout_s=args.timeout_s))
                )  # fmt: skip
                log(f"preview: worst error {figures.get('preview_error')}")
            log_tails = fleet.tails() if errors else ""
        if args.skip_shadow:
            figures.update({"shadow_available": False, "shadow_reason": "skipped (--skip-shadow)"})
        else:
            figures.update(_shadow(args, work, central_env, edge_env, errors, log))
    return _result(args, figures, sites, errors, log_tails, central_env, edge_env)


def _shadow(
    args: argparse.Namespace, work: Path, central_env: dict[str, str], edge_env: dict[str, str], errors: list[str],
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Part 3 on a fleet of its own whose edges serve central's default artifact without timing
    (timing would rightly pick FP32 for a model this small, and INT8 is what is under test)."""
    no_timing = {
        "MODELFLEET_INFERENCE__CHOICE__ENABLED": "false",
        "MODELFLEET_INFERENCE__SHADOW_SAMPLE": str(args.shadow_sample),
        **edge_env,
    }
    with Fleet(root=work, central_env=central_env, edge_env=no_timing, keep=args.keep) as fleet:
        _start(fleet, args.edges)
        shadow_dir = Path(fleet.dir or work) / "models"
        figures = _part("shadow", errors, lambda: measure_shadow(
            fleet, shadow_dir, max_requests=args.shadow_max_requests, timeout_s=args.timeout_s))  # fmt: skip
        log(f"shadow: {figures.get('shadow_detect_requests') or figures.get('shadow_reason')}")
        if not figures:  # the part failed: its fleet's logs go with the error
            figures["shadow_log_tails"] = fleet.tails()
    return figures


def _met(args: argparse.Namespace, figures: dict[str, Any]) -> dict[str, bool | None]:
    """Per target: met, missed, or None when its part did not run (skipped, or the shadow
    feature absent: ``shadow_available`` false). A part that failed counts as missed."""
    not_run = set()
    if args.skip_preview:
        not_run.add("preview_error")
    if not figures.get("shadow_available") and "shadow_reason" in figures:
        not_run |= {"shadow_detect_requests", "fallback_s"}
    out: dict[str, bool | None] = {}
    for key, target in TARGETS.items():
        value = figures.get(key)
        out[key] = None if key in not_run else value is not None and value <= target
    return out


def _result(
    args: argparse.Namespace, figures: dict[str, Any], sites: dict[str, str], errors: list[str], log_tails: str,
    central_env: dict[str, str], edge_env: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    met = _met(args, figures)
    return {
        "edges": args.edges,
        "sites": sites,
        **{key: figures.get(key) for key in TARGETS},
        **figures,
        "targets": dict(TARGETS),
        "met": {**met, "all": all(v for v in met.values() if v is not None)},
        "cpu_flags": cpu_flags(),
        "errors": errors,
        "log_tails": log_tails,
        "settings": {
            "flip_lead_s": args.flip_lead_s,
            "flip_width": args.flip_width,
            "width": args.width,
            "layers": args.layers,
            "heartbeat_interval_s": args.interval,
            "shadow_sample": args.shadow_sample,
            "choice_budget_s": args.choice_budget_s,
            "central_env": central_env,
            "edge_env": edge_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(result: dict[str, Any]) -> None:
    """Figures against targets."""
    print(f"{'figure':<24} {'value':>10} {'target':>10}")
    for key, target in TARGETS.items():
        ok = result["met"].get(key)
        verdict = "n/a" if ok is None else ("met" if ok else "MISSED")
        print(f"{key:<24} {_fmt(result.get(key)):>10} {'<= ' + format(target, 'g'):>10}  {verdict}")
    print(f"flip_error_s {_fmt(result.get('flip_error_s'))}, resolution ± {_fmt(result.get('flip_resolution_s'))} s;"
          f" clock offsets max {_fmt(result.get('clock_offset_abs_max_ms'))} ms")  # fmt: skip
    print(
        f"preview_error full {_fmt(result.get('preview_error_full'))}, delta {_fmt(result.get('preview_error_delta'))}"
    )
    if not result.get("shadow_available"):
        print(f"shadow: not available: {result.get('shadow_reason')}")
    print(f"edges {result['edges']}, cpu flags {' '.join(result['cpu_flags'])}")
    if result["errors"]:
        print(f"run errors: {result['errors']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--edges", type=int, default=8, help="edges in the fleet (alternately in two sites)")
    p.add_argument("--flip-width", type=int, default=64, help="width of the flipped MLP (v1, v2)")
    p.add_argument("--flip-lead-s", type=float, default=3.0, help="how far ahead the flip instant is set")
    p.add_argument("--width", type=int, default=384, help="width of the previewed MLPs (v3, v4)")
    p.add_argument("--layers", type=int, default=4, help="hidden layers of the previewed MLPs")
    p.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="heartbeat interval, seconds (8 edges timing artifacts on 2 cores miss 0.5 s beats and flap)",
    )
    p.add_argument("--shadow-max-requests", type=int, default=20000, help="give up on int8_drift after this many")
    p.add_argument("--choice-budget-s", type=float, default=5.0, help="edges' artifact timing budget per version")
    p.add_argument("--shadow-sample", type=float, default=0.01, help="share of live requests the edges shadow on FP32")
    p.add_argument("--skip-preview", action="store_true", help="skip part 2")
    p.add_argument("--skip-shadow", action="store_true", help="skip part 3")
    p.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for any step")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for every edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes")
    p.add_argument("--model-cache", type=Path, default=None, help="where generated MLPs are kept between runs")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run, print, write JSON; exit 1 when the run recorded errors (a missed target is a figure)."""
    args = parse_args(argv)
    with sigterm_raises():
        try:
            result = run(args)
        except (FleetError, ChildError) as exc:
            result = {"errors": [str(exc)]}
            print(json.dumps(result, indent=2), file=sys.stderr)
            return write_result(args.json, result)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    sys.exit(main())
