"""Sites benchmark: how many bytes cross each site's WAN link when a fleet of sites gets a model.

Real processes on real shaped links (``bench._netns.SiteTopology``, root only): central in
its own site ``hq`` behind a WAN link, ``--sites`` sites of ``--edges-per-site`` edges, each
site behind a WAN link of ``--wan-mb-s`` with ``--wan-delay-ms`` per direction (``netem``; on
a kernel without it, ``tbf`` for the rate and ``bench._wire`` for the delay: ``settings.shaping``
says which, ``delay_emulated`` whether the delay is there), edges of a site on a LAN of
``--lan-mb-s``. Every process runs in its host's namespace and listens on
its address; edges announce their site (``MODELFLEET_SITE``). Fleets, each fresh, each pushed
the same generated model:

* ``site_aware``: central's defaults (site-aware placement where central has it);
* ``baseline``: ``MODELFLEET_PLACEMENT__SITE_AWARE=false``;
* ``single``: ``hq`` and one site of one edge, the best a lone edge does over these links;
* ``distribution`` (unless ``--skip-distribution``): ``hq`` and one site of
  ``--distribution-edges`` edges on its LAN. This mirrors ``bench.distribution``'s 8 edges:
  there, the one constraint is central's egress cap and edges trade chunks over loopback;
  here, central's WAN link is that cap, the edges' own WAN link is the same rate (so it only
  constrains when central sends a chunk more than once) and peers trade over the LAN. Eight
  single-edge sites would instead cap every peer transfer at WAN rate: a different question,
  the one the site-aware runs ask.

``wan_bytes_in[site]``: bytes the site's WAN interface received from the push's 201 to the
last edge's completion (interface counters, Ethernet headers included); ``wan_ratio_max``:
the worst site's over ``model_bytes`` (the unique chunk bytes of the served artifact, what one
edge must hold: the pushed file's size for this model, as ``bench.distribution``'s).
``origin_ratio``: central's ``origin.bytes_sent`` over ``model_bytes``. ``rollout_s``: the
201 to the last edge's ``completed_at``. Targets: ``wan_ratio_max`` <= 1.10, ``origin_ratio``
<= 1.10, ``rollout_s`` <= 1.5 × ``single_edge_rollout_s``. Every edge's assembled file is
checked (sha256) against the pushed one; a mismatch, a failed fleet or a topology that cannot
be built is an error (exit 1), never a silent pass.

Usage: ``sudo python -m bench.sites --json out.json [--sites 3 --edges-per-site 3] [--model-mb 40]
[--wan-mb-s 20 --wan-delay-ms 30 --lan-mb-s 200] [--skip-distribution]``
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._fleet import (
    Fleet,
    FleetError,
    Proc,
    cached_mlp,
    chunking_env,
    model_cache_dir,
    parse_env_pairs,
    plan_mlp,
    sigterm_raises,
    write_result,
)
from bench._netns import Link, NetnsError, Site, SiteTopology, available, delay_unavailable, shaping
from bench.report import machine
from bench.zoo import cpu_flags
from modelfleet.up.services import EDGE_READY

TARGETS = {"wan_ratio_max": 1.10, "origin_ratio": 1.10, "rollout_over_single": 1.5}
MODEL_NAME = "bench-mlp"
VERSION = "v1"
CENTRAL_SITE = "hq"
CENTRAL_HOST = "central"
#: An edge's fetch counters worth keeping (``bytes_from_other_sites`` where the edge has it, else None).
_FETCH_KEYS = ("bytes_from_origin", "bytes_from_peers", "bytes_from_other_sites", "chunks_from_origin",
               "chunks_from_peers", "peer_errors", "origin_refusals", "failures")  # fmt: skip


class SiteFleet(Fleet):
    """A ``Fleet`` whose processes run in the hosts of a ``SiteTopology`` (host name = process name)."""

    def __init__(self, topology: SiteTopology, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topology = topology

    def _command_prefix(self, name: str) -> list[str]:
        return self.topology.prefix(name)

    def start_central(self, *, http_port: int = 0, grpc_port: int = 0) -> Proc:
        """Central in host ``central``'s namespace, listening on its address (known once the topology is built)."""
        address = self.topology.address(CENTRAL_HOST)
        self.central_env = {**self.central_env, "MODELFLEET_HTTP_HOST": address, "MODELFLEET_GRPC_HOST": address}
        return super().start_central(http_port=http_port, grpc_port=grpc_port)

    def start_site_edges(self, hosts: list[str]) -> None:
        """An edge in each host's namespace, listening and advertising its address, told its site."""
        started = []
        for host in hosts:
            address = self.topology.address(host)
            env = {
                "MODELFLEET_HTTP_HOST": address,
                "MODELFLEET_GRPC_HOST": address,
                "MODELFLEET_ADVERTISE_HOST": address,
                "MODELFLEET_SITE": self.topology.site_of(host),
            }
            started.append(self.start_edge(host, env=env, wait_ready=False))
        self._wait_ready(started, EDGE_READY)


@dataclass(frozen=True)
class Plan:
    """One fleet to run: its label, its edge sites (name → edge count), central's extra env."""

    label: str
    sites: dict[str, int]
    central_env: dict[str, str]


def model_bytes_of(manifest: Mapping[str, Any]) -> int:
    """Unique chunk bytes of the served artifact (graph file and data files): what an edge holds."""
    chunks = [*manifest["chunks"], *(c for f in manifest.get("files", []) for c in f["chunks"])]
    return sum({c["digest"]: c["size"] for c in chunks}.values())


def _topology(plan: Plan, wan: Link, lan: Link) -> SiteTopology:
    sites = [Site(CENTRAL_SITE, [CENTRAL_HOST], wan, lan)]
    sites += [Site(name, [f"{name}-e{j}" for j in range(count)], wan, lan) for name, count in plan.sites.items()]
    return SiteTopology(sites)


def run_fleet(plan: Plan, args: argparse.Namespace, model: Path, common_env: dict[str, str]) -> dict[str, Any]:
    """One fresh topology and fleet: start, push, wait for every edge, read counters and stats."""
    wan = Link(args.wan_mb_s * 1e6, args.wan_delay_ms / 1e3, args.wan_loss_pct)
    lan = Link(args.lan_mb_s * 1e6)
    env = {**common_env, **plan.central_env}
    edge_env = parse_env_pairs(args.edge_env)
    topo = _topology(plan, wan, lan)
    fleet = SiteFleet(topo, root=args.work_dir, central_env=env, edge_env=edge_env, keep=args.keep)
    with topo, fleet:  # the fleet's processes stop before the namespaces go
        fleet.start_central()
        fleet.start_site_edges([h for s in topo.sites[1:] for h in s.hosts])
        fleet.wait_registered(60.0)
        names = [s.name for s in topo.sites]
        before = {s: topo.wan_bytes(s) for s in names}
        cpu_before = fleet.cpu_seconds()
        pushed = fleet.push(MODEL_NAME, VERSION, model)
        done = fleet.wait_complete(MODEL_NAME, VERSION, timeout_s=args.timeout_s)
        after = {s: topo.wan_bytes(s) for s in names}
        cpu_after = fleet.cpu_seconds()
        stats = fleet.stats()
        manifest = fleet.manifest(MODEL_NAME, VERSION)
        verified = fleet.verify_files(MODEL_NAME, VERSION, pushed.sha256)
        statuses = fleet.statuses()
    model_bytes = model_bytes_of(manifest)
    cpu = {k: round(v - cpu_before.get(k, 0.0), 3) for k, v in cpu_after.items()}
    wan_in = {s: after[s][0] - before[s][0] for s in plan.sites}
    origin = stats["origin"]["bytes_sent"]
    return {
        "label": plan.label,
        "sites": len(plan.sites),
        "edges": sum(plan.sites.values()),
        "model_bytes": model_bytes,
        "pushed_bytes": pushed.size,
        "chunks": len(manifest["chunks"]),
        "rollout_s": max(c.completed_at for c in done.values()) - pushed.acked_at,
        "completed_after_s": {n: round(c.completed_at - pushed.acked_at, 3) for n, c in sorted(done.items())},
        "wan_bytes_in": wan_in,
        "wan_bytes_out": {s: after[s][1] - before[s][1] for s in plan.sites},
        "central_wan_bytes_out": after[CENTRAL_SITE][1] - before[CENTRAL_SITE][1],
        "wan_ratio_max": max(wan_in.values()) / model_bytes,
        "origin_bytes": origin,
        "origin_ratio": origin / model_bytes,
        "files_verified": verified,
        "per_edge": {
            n: {"site": s.get("site"), **{k: s["fetch"].get(k) for k in _FETCH_KEYS}}
            for n, s in sorted(statuses.items())
        },
        "all_files_verified": all(verified.values()) and len(verified) == len(done),
        "central_cpu_s": cpu.get("central"),
        "edges_cpu_s": round(sum(v for k, v in cpu.items() if k != "central"), 3),
    }


def _plans(args: argparse.Namespace) -> list[Plan]:
    sites = {f"s{i}": args.edges_per_site for i in range(1, args.sites + 1)}
    plans = [
        Plan("site_aware", sites, {}),
        Plan("baseline", sites, {"MODELFLEET_PLACEMENT__SITE_AWARE": "false"}),
        Plan("single", {"s1": 1}, {}),
    ]
    if not args.skip_distribution:
        plans.append(Plan("distribution", {"s1": args.distribution_edges}, {}))
    return plans


def _over(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def summarise(runs: dict[str, dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    """The headline figures, the targets and whether each was met."""
    aware, base, single = runs["site_aware"], runs["baseline"], runs["single"]
    over_single = _over(aware["rollout_s"], single["rollout_s"])
    verified = all(r["all_files_verified"] for r in runs.values())
    if not verified:
        errors.append(f"assembled files that do not match the push: {_unverified(runs)}")
    result: dict[str, Any] = {
        "model_bytes": aware["model_bytes"],
        "wan_bytes_in": aware["wan_bytes_in"],
        "wan_ratio_max": aware["wan_ratio_max"],
        "origin_ratio": aware["origin_ratio"],
        "rollout_s": aware["rollout_s"],
        "single_edge_rollout_s": single["rollout_s"],
        "rollout_over_single": over_single,
        "baseline_wan_bytes_in": base["wan_bytes_in"],
        "baseline_wan_ratio_max": base["wan_ratio_max"],
        "baseline_rollout_s": base["rollout_s"],
        "baseline_origin_ratio": base["origin_ratio"],
        "all_files_verified": verified,
        "targets": dict(TARGETS),
        "met": {
            "wan_ratio_max": aware["wan_ratio_max"] <= TARGETS["wan_ratio_max"],
            "origin_ratio": aware["origin_ratio"] <= TARGETS["origin_ratio"],
            "rollout_over_single": over_single <= TARGETS["rollout_over_single"],
            "files_verified": verified,
        },
    }
    if "distribution" in runs:
        d = runs["distribution"]
        result["distribution"] = {
            "edges": d["edges"],
            "origin_ratio": d["origin_ratio"],
            "rollout_s": d["rollout_s"],
            "single_edge_rollout_s": single["rollout_s"],
            "rollout_over_single": _over(d["rollout_s"], single["rollout_s"]),
            "wan_ratio_max": d["wan_ratio_max"],
            "met": {
                "origin_ratio": d["origin_ratio"] <= TARGETS["origin_ratio"],
                "rollout_over_single": _over(d["rollout_s"], single["rollout_s"]) <= TARGETS["rollout_over_single"],
            },
        }
    return result


def _unverified(runs: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {label: [n for n, ok in r["files_verified"].items() if not ok] for label, r in runs.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build each topology and fleet in turn; summarise against the targets."""
    started, errors = time.monotonic(), []
    settings: dict[str, Any] = {
        "wan_bytes_s": args.wan_mb_s * 1e6,
        "wan_delay_s": args.wan_delay_ms / 1e3,
        "wan_loss_pct": args.wan_loss_pct,
        "lan_bytes_s": args.lan_mb_s * 1e6,
        "shaping": shaping(),
        "delay_emulated": delay_unavailable() is None,
        "link_note": delay_unavailable(),
        "chunk_avg_kb": args.chunk_avg_kb,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    base = {"sites": args.sites, "edges_per_site": args.edges_per_site, "cpu_flags": cpu_flags(), "machine": machine()}
    if (reason := available()) is not None:
        return {**base, "settings": settings, "errors": [f"no topology here: {reason}"], "runs": {}}
    width, layers = plan_mlp(int(args.model_mb * 1e6))
    model = cached_mlp(model_cache_dir(args.model_cache), width=width, hidden_layers=layers)
    # Distribution of the pushed bytes is measured; quantizing a random MLP would only add push time.
    common_env = {"MODELFLEET_QUANTIZE__ENABLED": "false", **chunking_env(args.chunk_avg_kb)}
    common_env |= parse_env_pairs(args.central_env)
    if not args.timeout_s:
        args.timeout_s = max(120.0, 20 * model.stat().st_size / (args.wan_mb_s * 1e6))
    settings |= {"model_file": model.name, "width": width, "hidden_layers": layers, "central_env": common_env}
    print(f"model {model.name}: {model.stat().st_size / 1e6:.1f} MB; links: {settings}", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    for plan in _plans(args):
        print(f"running {plan.label} ({plan.sites}) ...", flush=True)
        try:
            runs[plan.label] = r = run_fleet(plan, args, model, common_env)
        except (FleetError, NetnsError) as exc:  # the fleet's log tails are in the message
            errors.append(f"{plan.label}: {exc}")
            print(f"  failed: {str(exc)[:2000]}", file=sys.stderr, flush=True)
            continue
        print(f"  rollout {r['rollout_s']:.2f}s, wan in {r['wan_bytes_in']}, origin {r['origin_ratio']:.3f}",
              flush=True)  # fmt: skip
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    settings["bench_wall_s"] = round(time.monotonic() - started, 1)
    settings["bench_cpu_s"] = round(sum(u.ru_utime + u.ru_stime for u in usage), 1)
    summary = summarise(runs, errors) if {"site_aware", "baseline", "single"} <= set(runs) else {}
    return {**base, **summary, "settings": settings, "runs": runs, "errors": errors}


def _print_table(result: dict[str, Any]) -> None:
    header = (
        f"{'fleet':<13} {'edges':>5} {'rollout s':>9} {'wan in max/model':>16} {'origin/model':>12} {'verified':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in result.get("runs", {}).values():
        print(
            f"{r['label']:<13} {r['edges']:>5} {r['rollout_s']:>9.2f} {r['wan_ratio_max']:>16.3f} "
            f"{r['origin_ratio']:>12.3f} {r['all_files_verified']!s:>8}"
        )
    if "met" in result:
        print(f"targets {result['targets']}; met {result['met']}")
    s = result["settings"]
    cost = f"bench CPU {s.get('bench_cpu_s')} s, wall {s.get('bench_wall_s')} s"
    print(f"links: delay emulated {s['delay_emulated']}; {cost}")
    for error in result["errors"]:
        print(f"ERROR: {error}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.sites", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--sites", type=int, default=3, help="edge sites (central has its own besides)")
    p.add_argument("--edges-per-site", type=int, default=3)
    p.add_argument("--model-mb", type=float, default=40.0, help="model size, at least this many MB (1e6 bytes)")
    p.add_argument("--wan-mb-s", type=float, default=20.0, help="each WAN link's rate per direction, MB/s")
    p.add_argument("--wan-delay-ms", type=float, default=30.0, help="each WAN link's delay per direction (netem)")
    p.add_argument("--wan-loss-pct", type=float, default=0.0, help="each WAN link's loss per direction (netem)")
    p.add_argument("--lan-mb-s", type=float, default=200.0, help="each LAN link's rate per direction, MB/s")
    p.add_argument("--chunk-avg-kb", type=int, default=1024, help="average chunk size in KiB (min avg/4, max avg×4)")
    p.add_argument("--distribution-edges", type=int, default=8, help="edges of the flat distribution fleet")
    p.add_argument("--skip-distribution", action="store_true", help="no flat distribution fleet")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for every edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--timeout-s", type=float, default=0.0, help="per-fleet rollout timeout (0: from size and rate)")
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()), help="where fleet dirs go")
    p.add_argument("--model-cache", type=Path, default=None, help="generated models are kept here")
    p.add_argument("--keep", action="store_true", help="keep the fleets' data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON (exit 1 on errors)."""
    args = build_parser().parse_args(argv)
    if min(args.sites, args.edges_per_site, args.distribution_edges) < 1 or min(args.model_mb, args.wan_mb_s) <= 0:
        print("--sites, --edges-per-site, --distribution-edges, --model-mb and --wan-mb-s must be positive",
              file=sys.stderr)  # fmt: skip
        return 2
    with sigterm_raises():
        result = run(args)
    _print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
