"""Autonomy benchmark: a fleet that loses central and the broker, then every edge power-cycles.

A real fleet (central, a private Mosquitto, ``--edges`` edges, heartbeats on) serves the
digits model (INT8, quantized by central on push). A client thread per edge sends OIP v2
requests straight to that edge the whole time. Then:

1. central and the broker are SIGKILLed;
2. every edge is SIGKILLed and started again on its own data dir and HTTP port, central
   and the broker still gone: ``cold_boot_ready_s`` runs from the spawn to the edge's
   ``/v2/models/digits/ready`` answering 200 (it serves from its sealed desired state on disk);
3. after ``--autonomous-s``, the broker and central come back (central on its old ports and
   data dir): ``resync_s`` runs from central's ready line to the moment every edge's
   ``/api/v1/status`` says ``synced``.

``errors`` counts failed requests except those an edge could not answer because it was down:
from its SIGKILL to its first ready after the restart. Everything else, while central and the
broker are gone included, must succeed. Targets: every edge ready, ``errors`` 0, ``resync_s`` <= 5.

Usage: ``python -m bench.autonomy --json out.json [--edges 4] [--autonomous-s 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench._fleet import Fleet, parse_env_pairs, sigterm_raises
from bench.failover import CHUNKING_ENV, Result, StreamClient, _fmt, _round, oip_bodies
from bench.heartbeat_scale import percentile
from bench.zoo import cpu_flags
from modelfleet.up.children import ChildError
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker
from modelfleet.zoo import build_digits

MODEL = "digits"
VERSION = "v1"
TARGETS: dict[str, float] = {"errors": 0, "resync_s": 5.0}
_POLL_S = 0.02


def _get_json(client: httpx.Client, url: str) -> dict[str, Any] | None:
    try:
        r = client.get(url, timeout=2.0)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def _ready(client: httpx.Client, base: str) -> bool:
    try:
        return client.get(f"{base}/v2/models/{MODEL}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_all(predicate: Callable[[str], bool], names: list[str], timeout_s: float) -> dict[str, float | None]:
    """Poll ``predicate(name)`` for every name until true; returns when each first was (monotonic)."""
    seen: dict[str, float | None] = dict.fromkeys(names)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(v is None for v in seen.values()):
        for name in names:
            if seen[name] is None and predicate(name):
                seen[name] = time.monotonic()
        time.sleep(_POLL_S)
    return seen


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the fleet, take central and the broker away, power-cycle every edge, bring them back."""
    digits = build_digits()
    bodies = oip_bodies(digits.test_x, digits.input_name)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    errors: list[str] = []
    with MosquittoBroker(log=BENCH_LOG) as broker:
        broker_env = {"MODELFLEET_BROKER__HOST": broker.host, "MODELFLEET_BROKER__PORT": str(broker.port)}
        central_env = {"MODELFLEET_MQTT__ENABLED": "true", **broker_env, **CHUNKING_ENV}
        central_env.update(parse_env_pairs(args.central_env))
        edge_env = {
            "MODELFLEET_HEARTBEAT__ENABLED": "true",
            "MODELFLEET_HEARTBEAT__INTERVAL_S": str(args.interval),
            **broker_env,
            **parse_env_pairs(args.edge_env),
        }
        with Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
            fleet.start(edges=args.edges)
            pushed = fleet.push_files(MODEL, VERSION, digits.onnx_path, calibration=digits.calibration_path)
            names = sorted(fleet.edges)
            for node in names:
                fleet.wait_model_ready(node, MODEL, timeout_s=args.timeout_s)
            urls = {n: fleet.edges[n].http_url for n in names}
            ports = {n: int(urls[n].rsplit(":", 1)[1]) for n in names}
            http = httpx.Client(trust_env=False)

            def status(node: str) -> dict[str, Any] | None:
                return _get_json(http, f"{urls[node]}/api/v1/status")

            synced = wait_all(lambda n: (status(n) or {}).get("mode") == "synced", names, args.timeout_s)
            if any(v is None for v in synced.values()):
                errors.append(f"not every edge synced before the outage: {synced}")
            clients = {n: StreamClient(f"{urls[n]}/v2/models/{MODEL}/infer", bodies, concurrency=1) for n in names}
            for c in clients.values():
                c.start()
            down: dict[str, tuple[float, float | None]] = {}
            try:
                time.sleep(args.steady_s)
                central_http, central_grpc = fleet.central_ports()
                t_outage = time.monotonic()
                fleet.kill_central()
                broker.kill()
                log(f"central and broker SIGKILLed; {len(names)} edges serving on their own")
                time.sleep(args.steady_s)
                spawned: dict[str, float] = {}
                for node in names:
                    killed_at = time.monotonic()
                    fleet.edges[node].kill()
                    fleet.start_edge(node, http_port=ports[node], wait_ready=False)
                    spawned[node] = time.monotonic()
                    down[node] = (killed_at, None)
                ready = wait_all(lambda n: _ready(http, urls[n]), names, args.timeout_s)
                for node, at in ready.items():
                    down[node] = (down[node][0], at)
                boot = {n: (at - spawned[n] if at is not None else None) for n, at in ready.items()}
                log("cold boot ready: " + ", ".join(f"{n} {_fmt(v)} s" for n, v in boot.items()))
                modes = {n: (status(n) or {}).get("mode") for n in names}
                time.sleep(args.autonomous_s)
                broker.restart()
                t_back_start = time.monotonic()
                fleet.start_central(http_port=central_http, grpc_port=central_grpc)
                t_back = time.monotonic()
                log(f"broker and central back (central ready after {t_back - t_back_start:.2f} s)")
                resynced = wait_all(lambda n: (status(n) or {}).get("mode") == "synced", names, args.timeout_s)
                time.sleep(args.steady_s)
            finally:
                for c in clients.values():
                    c.stop()
            outage_s = t_back - t_outage
            generations = {n: (status(n) or {}).get("generation") for n in names}
            http.close()
            log_tails = fleet.tails() if errors else ""
    results = {n: c.snapshot() for n, c in clients.items()}

    def excused(node: str, r: Result) -> bool:
        """Whether the edge was down for part of the request: in flight at its SIGKILL, or
        sent before its first ready after the restart."""
        killed_at, ready_at = down[node]
        return r.end >= killed_at and (ready_at is None or r.start < ready_at)

    failed = [(n, r) for n, rs in results.items() for r in rs if r.status != 200 and not excused(n, r)]
    requests = sum(len(rs) for rs in results.values())
    boot_values = [v for v in boot.values() if v is not None]
    all_ready = len(boot_values) == len(names)
    if not all_ready:
        errors.append(f"edges not ready after the restart: {[n for n, v in boot.items() if v is None]}")
    if any(m != "autonomous" for m in modes.values()):
        errors.append(f"edges not autonomous while central was away: {modes}")
    resync_values = [at - t_back for at in resynced.values() if at is not None]
    resync_s = max(resync_values) if len(resync_values) == len(names) else None
    if resync_s is None:
        errors.append(f"edges not synced within {args.timeout_s}s of central's return")
    met = {
        "all_ready": all_ready,
        "errors": len(failed) <= TARGETS["errors"],
        "resync_s": resync_s is not None and resync_s <= TARGETS["resync_s"],
    }
    return {
        "edges": len(names),
        "model": {"name": MODEL, "artifact": pushed.manifest.get("artifact"), "bytes": pushed.manifest.get("size")},
        "cold_boot_ready_s": {n: _round(v) for n, v in boot.items()},
        "cold_boot_ready_s_p99": _round(percentile(boot_values, 99)),
        "requests": requests,
        "errors": len(failed),
        "excused_while_down": sum(1 for n, rs in results.items() for r in rs if r.status != 200 and excused(n, r)),
        "error_samples": [{"node": n, "status": r.status, "error": r.error} for n, r in failed[:10]],
        "resync_s": _round(resync_s),
        "resync_s_by_edge": {n: _round(at - t_back if at is not None else None) for n, at in resynced.items()},
        "outage_s": round(outage_s, 3),
        "modes_while_away": modes,
        "generations_after": generations,
        "targets": {"all_ready": True, **TARGETS},
        "met": {**met, "all": all(met.values())},
        "cpu_flags": cpu_flags(),
        "run_errors": errors,
        "log_tails": log_tails,
        "settings": {
            "heartbeat_interval_s": args.interval,
            "autonomous_s": args.autonomous_s,
            "central_env": central_env,
            "edge_env": edge_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }


def print_table(result: dict[str, Any]) -> None:
    """Figures against targets."""
    met = result["met"]
    rows = [
        ("cold_boot_ready_s_p99", _fmt(result["cold_boot_ready_s_p99"]), "every edge", met["all_ready"]),
        ("errors", str(result["errors"]), f"<= {TARGETS['errors']:g}", met["errors"]),
        ("resync_s", _fmt(result["resync_s"]), f"<= {TARGETS['resync_s']:g}", met["resync_s"]),
    ]
    print(f"{'figure':<22} {'value':>10} {'target':>12}")
    for name, value, target, ok in rows:
        print(f"{name:<22} {value:>10} {target:>12}  {'met' if ok else 'MISSED'}")
    print(f"edges {result['edges']}, requests {result['requests']}, cpu flags {' '.join(result['cpu_flags'])}")
    if result["run_errors"]:
        print(f"run errors: {result['run_errors']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--edges", type=int, default=4, help="edges in the fleet")
    p.add_argument("--interval", type=float, default=0.5, help="heartbeat interval, seconds")
    p.add_argument("--steady-s", type=float, default=1.0, help="seconds of traffic before and after each step")
    p.add_argument("--autonomous-s", type=float, default=3.0, help="seconds the restarted edges run without central")
    p.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for any step")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for every edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run, print, write JSON; exit 1 when the run recorded errors."""
    args = parse_args(argv)
    with sigterm_raises():
        try:
            result = run(args)
        except ChildError as exc:
            result = {"run_errors": [str(exc)]}
            print(json.dumps(result, indent=2), file=sys.stderr)
            return write_json(args.json, result)
    print_table(result)
    return write_json(args.json, result)


def write_json(path: Path, result: dict[str, Any]) -> int:
    """Write the JSON; the exit code is 1 when the run recorded errors (``run_errors``: here
    ``errors`` is the count of failed requests, a figure against a target, not a run error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["run_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
