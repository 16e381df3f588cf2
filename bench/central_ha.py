"""Central without a single point of failure: 3 replicas under load lose their leader, then
another replica, and nothing is lost, nobody is falsely declared dead and the gateway answers.

Usage: ``python -m bench.central_ha --json out.json [--replicas 3] [--nodes 10000] [--rate 1]
[--edges 2] [--window-s 20] [--silent-fraction 0.01] [--partitions 64]``

What runs (all real processes on loopback): a private PostgreSQL, an S3 server (SeaweedFS), a
private Mosquitto, ``--replicas`` × ``modelfleet central --replica-id rN`` sharing them,
``--edges`` real edges that know every replica, and simulated nodes (``bench.heartbeat_scale``'s
raw-socket simulator) heartbeating at ``--rate`` Hz on their partitioned topics, each with a
retained birth.

Timeline: replicas, then a leader; births; edges and a first push; then, for the window:
a gateway client (every request to a live replica, moving to the next one when a replica
does not answer, as a load balancer does), a pusher (a small new version every second to a
live replica), heartbeats. The share of heartbeats each replica handles is measured over the
first third. At a third the leader is SIGKILLed, at two thirds another replica; in the middle
``--silent-fraction`` of the simulated nodes fall silent. At the end: liveness as the replicas
wrote it to PostgreSQL, and every acknowledged push checked on every surviving replica (its
manifest, and each of its chunks in the bucket). Last (``bench._ha_s3``): pushes go on while
the S3 server is SIGKILLed and restarted twice, and every one acked must still be there, byte
for byte, with no version listed whose chunks are not all stored.

Keys: ``replicas``, ``nodes``, ``pushes_acked``, ``pushes_lost``, ``leader_takeover_s`` (kill →
a live replica reports leading), ``edge_reattach_s_p99`` (kill → the edges that were on the
killed replica registered on another), ``gateway_requests``, ``gateway_errors``,
``false_deaths``, ``missed_deaths``, ``heartbeat_share_max_over_mean``, ``s3_restart_pushes_lost``,
``s3_restart_half_listed`` and ``s3_restart_unclear_answers`` (with ``s3_restart_ready_s``, SIGKILL →
serving, and ``s3_restart_pushes_cut``, pushes under way at a kill),
``seal_cpu_s_per_change`` (and ``_old``: ``bench._ha_seal`` at ``--nodes``, in process once the
fleet is down), ``decisions_lost_on_leader_kill`` (and ``decisions``: its section,
``bench._ha_decisions``, on a small fleet of its own after the main run); ``cpu_flags`` and
``machine`` say where it ran.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from bench import _ha_pg_restart
from bench._fleet import sigterm_raises, write_result
from bench._ha_decisions import run_decisions
from bench._ha_s3 import S3_TARGETS, s3_restart_pushes
from bench._ha_seal import seal_keys
from bench._replicas import ReplicatedFleet, replica_env, wait_until
from bench.heartbeat_scale import BROKER_EXTRA_CONF, SimProc
from bench.report import machine
from bench.zoo import cpu_flags
from fleetwire.mqtt.topics import DEFAULT_PREFIX
from modelfleet.up.mosquitto import MosquittoBroker
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo.synthetic import build_mlp

TARGETS = {
    "pushes_lost": 0,
    "gateway_errors": 0,
    "false_deaths": 0,
    "missed_deaths": 0,
    "leader_takeover_s": 5.0,
    "heartbeat_share_max_over_mean": 1.25,
    "seal_cpu_s_per_change": 0.05,
    "decisions_lost_on_leader_kill": 0,
    **S3_TARGETS,
}
_WIDTH = 32  # the test MLP's input width


def _log(message: str) -> None:
    print(f"[central_ha] {message}", file=sys.stderr, flush=True)


@dataclass
class Gateway:
    """Inference through the replicas' gateways, failing over between replicas like a load balancer."""

    fleet: ReplicatedFleet
    requests: int = 0
    errors: int = 0
    #: (wall time, what the last replica tried answered) of the first failures
    failures: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, _WIDTH], "data": [0.5] * _WIDTH}]}
        turn = 0
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0)) as client:
            while not self.stop.is_set():
                live = self.fleet.live()
                ok = False
                last = ""
                for k in range(len(live)):
                    proc = live[(turn + k) % len(live)]
                    try:
                        r = client.post(f"{proc.http_url}/v2/models/demo/infer", json=body)
                    except httpx.TransportError as exc:  # the replica is down: the next one
                        last = f"{proc.name}: {type(exc).__name__}"
                        continue
                    ok = r.status_code == 200
                    last = f"{proc.name}: {r.status_code} {r.text[:120]}"
                    break
                turn += 1
                self.requests += 1
                if not ok:
                    self.errors += 1
                    if len(self.failures) < 10:
                        self.failures.append((time.time(), last))
                time.sleep(0.02)


@dataclass
class Pusher:
    """A small new version of ``pushed`` every ``every_s`` to a live replica; remembers what was acked."""

    fleet: ReplicatedFleet
    models: list[Path]
    every_s: float = 1.0
    acked: list[str] = field(default_factory=list)
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        bodies = [m.read_bytes() for m in self.models]
        with httpx.Client(timeout=30.0) as client:
            while not self.stop.wait(self.every_s):
                live = self.fleet.live()
                if not live:
                    continue
                proc = random.choice(live)
                try:
                    r = client.post(
                        f"{proc.http_url}/api/v1/models/pushed/versions",
                        content=bodies[(len(self.acked) + self.refused) % len(bodies)],
                        headers={"Content-Type": "application/octet-stream"},
                    )
                except httpx.TransportError:
                    self.refused += 1  # never acknowledged: the client knows to push again
                    continue
                if r.status_code == 201:
                    self.acked.append(str(r.json()["manifest"]["version"]))
                else:
                    self.refused += 1


def _processed(fleet: ReplicatedFleet) -> dict[str, int]:
    out = {}
    for proc in fleet.live():
        body = fleet.client.get(f"{proc.http_url}/api/v1/membership", params={"summary": "true"}).json()
        out[proc.name] = int(body["counters"]["heartbeats_processed"])
    return out


def _edge_central(fleet: ReplicatedFleet, node_id: str) -> str | None:
    """The replica address an edge follows, registered and watching (None while it is not)."""
    try:
        status = fleet.edge_status(node_id)
    except (httpx.HTTPError, ValueError):
        return None
    central = status.get("central")
    return str(central.get("address")) if status.get("connected") and isinstance(central, dict) else None


def _gateways_serve(fleet: ReplicatedFleet, model: str) -> bool:
    """Whether every live replica's gateway answers an inference for ``model``."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, _WIDTH], "data": [0.5] * _WIDTH}]}
    for proc in fleet.live():
        try:
            if fleet.client.post(f"{proc.http_url}/v2/models/{model}/infer", json=body).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
    return True


def _reattach(fleet: ReplicatedFleet, victim: str, killed_at: float, followers: dict[str, list[str]]) -> list[float]:
    """Seconds from ``victim``'s kill until each edge that followed it follows another replica."""
    address = fleet.replicas[victim].grpc_address
    times = []
    for e in followers.get(address, []):
        moved = f"{e} on another replica"
        wait_until(lambda e=e: _edge_central(fleet, e) not in (None, address), 60, moved, poll_s=0.02)
        times.append(time.time() - killed_at)
    return times


def _lost_pushes(fleet: ReplicatedFleet, acked: list[str], s3: S3Server, bucket: str) -> list[str]:
    """Acked versions missing on a surviving replica, or with a chunk missing from the bucket."""
    lost = []
    client = s3.client()
    for version in acked:
        for proc in fleet.live():
            r = fleet.client.get(f"{proc.http_url}/api/v1/models/pushed/versions/{version}")
            if r.status_code != 200:
                lost.append(f"{version} on {proc.name}: {r.status_code}")
                break
        else:
            manifest = r.json()
            for chunk in manifest["chunks"]:
                key = f"sha256/{chunk['digest'][:2]}/{chunk['digest']}"
                try:
                    client.head_object(Bucket=bucket, Key=key)
                except Exception:  # boto's ClientError: the chunk is not there
                    lost.append(f"{version}: chunk {chunk['digest'][:12]} missing")
                    break
    return lost


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run in a work directory of its own, removed at the end (models, simulator files)."""
    with tempfile.TemporaryDirectory(prefix="central-ha-") as work:
        return _run(args, Path(work))


def _run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rng = random.Random(7)
    interval = 1.0 / args.rate
    node_ids = [f"sim-{i:06d}" for i in range(args.nodes)]
    silent = set(rng.sample(node_ids, max(1, round(args.nodes * args.silent_fraction))))
    model = build_mlp(work / "demo.onnx", width=_WIDTH, hidden_layers=1)
    errors: list[str] = []
    with PostgresInstance() as pg, S3Server() as s3, MosquittoBroker() as broker:
        with broker.conf_path.open("a") as conf:
            conf.write(BROKER_EXTRA_CONF)
        bucket = s3.new_bucket()
        store_url = pg.fresh_database()
        central_env = {
            **replica_env(
                store_url=store_url,
                blob_env=s3.blob_env(bucket),
                broker=(broker.host, broker.port),
                partitions=args.partitions,
            ),
            "MODELFLEET_QUANTIZE__ENABLED": "false",
            "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": repr(interval),
            "MODELFLEET_EVENTS__KEPT": str(max(20_000, 2 * args.nodes + 1000)),
        }
        edge_env = {
            "MODELFLEET_HEARTBEAT__ENABLED": "true",
            "MODELFLEET_HEARTBEAT__INTERVAL_S": "0.5",
            "MODELFLEET_BROKER__HOST": broker.host,
            "MODELFLEET_BROKER__PORT": str(broker.port),
            "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
        }
        sims: list[SimProc] = []
        with ReplicatedFleet(root=work, central_env=central_env, edge_env=edge_env, log=_log) as fleet:
            fleet.start_replicas(args.replicas)
            wait_until(lambda: fleet.leader() is not None, 30, "a leader")
            _log(f"{args.replicas} replicas up, {fleet.leader()} leads")

            for p in range(args.sim_procs):
                idxs = list(range(p, args.nodes, args.sim_procs))
                sims.append(
                    SimProc(
                        f"sim{p}",
                        {
                            "host": broker.host,
                            "port": broker.port,
                            "prefix": DEFAULT_PREFIX,
                            "interval_s": interval,
                            "connections": max(1, args.connections // args.sim_procs),
                            "client_prefix": f"ha-sim{p}",
                            "node_ids": [node_ids[i] for i in idxs],
                            "indexes": idxs,
                            "phases": [interval * i / args.nodes for i in idxs],
                            "silent": sorted(node_ids[i] for i in idxs if node_ids[i] in silent),
                            "partitions": args.partitions,
                        },
                        work,
                    )
                )
            for s in sims:
                s.expect("births", 120)
            _log(f"{args.nodes} simulated nodes born")

            for i in range(args.edges):
                fleet.start_edge(f"edge-{i}")
            fleet.push("demo", "1", model)
            for i in range(args.edges):
                fleet.wait_model_ready(f"edge-{i}", "demo", timeout_s=120)

            def everyone_alive() -> bool:
                with psycopg.connect(store_url) as conn:
                    row = conn.execute("SELECT count(*) FROM ha_liveness WHERE state = 'alive'").fetchone()
                return row is not None and int(row[0]) >= args.nodes + args.edges

            wait_until(everyone_alive, 120, "every node alive in the shared liveness", poll_s=0.5)
            wait_until(lambda: _gateways_serve(fleet, "demo"), 60, "every replica's gateway serving demo", poll_s=0.2)

            gateway = Gateway(fleet)
            variants = [build_mlp(work / f"pushed-{k}.onnx", width=_WIDTH, hidden_layers=1, seed=k) for k in range(4)]
            pusher = Pusher(fleet, variants)
            threads = [threading.Thread(target=x.run, daemon=True) for x in (gateway, pusher)]
            for t in threads:
                t.start()
            third = args.window_s / 3
            t0 = time.time()
            for s in sims:
                s.send(f"go {t0!r} {t0 + 1.5 * third!r} {t0 + 10 * args.window_s!r}")
            before = _processed(fleet)
            time.sleep(third)
            after = _processed(fleet)
            handled = [after[k] - before[k] for k in before]
            mean = sum(handled) / len(handled)
            share = max(handled) / mean if mean > 0 else float("inf")
            _log(f"heartbeats handled per replica over {third:.1f}s: {dict(zip(before, handled, strict=True))}")
            on_victim: dict[str, list[str]] = {}  # replica address → the edges following it
            for e in fleet.edges:
                on_victim.setdefault(_edge_central(fleet, e) or "", []).append(e)

            # 1: the leader.
            leader = fleet.leader()
            assert leader is not None
            killed_at = fleet.kill_replica(leader)
            takeover = wait_until(lambda: fleet.leader() not in (None, leader), 30, "a new leader", poll_s=0.02)
            reattach = _reattach(fleet, leader, killed_at, on_victim)
            _log(f"leader {leader} killed: {fleet.leader()} leads after {takeover:.2f}s; edges moved in {reattach}")

            time.sleep(max(0.0, t0 + 2 * third - time.time()))
            # 2: another replica (not the new leader, when there is a choice).
            new_leader = fleet.leader()
            victim = next((p.name for p in fleet.live() if p.name != new_leader), None)
            if victim is not None and len(fleet.live()) > 1:
                moved = _reattach(fleet, victim, fleet.kill_replica(victim), on_victim)
                reattach += moved
                _log(f"replica {victim} killed: edges moved in {moved}")
            time.sleep(max(0.0, t0 + args.window_s - time.time()))
            pusher.stop.set()
            grace = 3 * interval + 3 * args.tick_s + 2  # dead_after, hand-over ticks, a margin
            time.sleep(grace)
            gateway.stop.set()
            for t in threads:
                t.join(timeout=30)

            with psycopg.connect(store_url) as conn:
                states = {str(n): str(s) for n, s in conn.execute("SELECT node_id, state FROM ha_liveness")}
            dead = {n for n, s in states.items() if s == "dead"}
            false_deaths = sorted(n for n in dead if n not in silent)
            missed_deaths = sorted(n for n in silent if n not in dead)
            lost = _lost_pushes(fleet, pusher.acked, s3, bucket)
            s3_restarts = s3_restart_pushes(fleet, s3, bucket, work, log=_log)
            if gateway.failures:
                marks = f"(window from {t0:.2f}, leader killed at {killed_at:.2f})"
                errors.append(f"gateway failures {marks}: {[(round(t - t0, 2), w) for t, w in gateway.failures]}")
            for s in sims:
                s.send("stop")
            for s in sims:
                s.stop()
        decisions = run_decisions(pg, s3, broker, work, _log)
    result: dict[str, Any] = {
        "bench": "central_ha",
        "machine": machine(),
        "cpu_flags": cpu_flags(),
        "replicas": args.replicas,
        "nodes": args.nodes,
        "rate_hz": args.rate,
        "partitions": args.partitions,
        "window_s": args.window_s,
        "pushes_acked": len(pusher.acked),
        "pushes_refused": pusher.refused,
        "pushes_lost": len(lost),
        "lost": lost[:10],
        "leader_takeover_s": round(takeover, 3),
        "edge_reattach_s_p99": round(float(np.percentile(reattach, 99)), 3) if reattach else None,
        "edges_moved": len(reattach),
        "gateway_requests": gateway.requests,
        "gateway_errors": gateway.errors,
        "false_deaths": len(false_deaths),
        "false_dead_nodes": false_deaths[:10],
        "missed_deaths": len(missed_deaths),
        "silenced": len(silent),
        "heartbeats_handled": handled,
        "heartbeat_share_max_over_mean": round(share, 3),
        **s3_restarts,
        **seal_keys(args.nodes),  # central's CPU to seal one fleet-wide change (bench._ha_seal), after the run
        "decisions_lost_on_leader_kill": decisions["decisions_lost_on_leader_kill"],
        "decisions": decisions,
        "errors": errors,
    }
    met = {key: (result[key] <= target) if result[key] is not None else False for key, target in TARGETS.items()}
    result["targets"] = dict(TARGETS)
    result["met"] = {**met, "all": all(met.values())}
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.central_ha", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True, help="Where to write the result.")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--nodes", type=int, default=10_000, help="Simulated nodes heartbeating through the broker.")
    p.add_argument("--rate", type=float, default=1.0, help="Heartbeats per node per second.")
    p.add_argument("--edges", type=int, default=3, help="Real edges (the n-th starts on the n-th replica).")
    p.add_argument("--window-s", type=float, default=30.0, help="The measured window: kills at 1/3 and 2/3.")
    p.add_argument("--silent-fraction", type=float, default=0.01)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--tick-s", type=float, default=0.5, help="The replicas' ha.tick_s (for the grace at the end).")
    p.add_argument("--sim-procs", type=int, default=2)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument(
        "--pg-restart", action="store_true", help="Also /healthz while PostgreSQL restarts (bench._ha_pg_restart)."
    )
    _ha_pg_restart.add_arguments(p)
    return p


def print_table(r: dict[str, Any]) -> None:
    print(f"central_ha: {r['replicas']} replicas, {r['nodes']} nodes at {r['rate_hz']} Hz ({r['machine']})")
    for key, target in r["targets"].items():
        print(f"  {key:32} {r[key]!s:>10}  target ≤ {target}  {'met' if r['met'][key] else 'MISSED'}")
    for key in ("pushes_acked", "edge_reattach_s_p99", "gateway_requests", "silenced"):
        print(f"  {key:32} {r[key]!s:>10}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.replicas < 2:
        print("--replicas must be at least 2 (one is killed, then another)", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
        if args.pg_restart:
            _ha_pg_restart.merge_into(result, _ha_pg_restart.run(args))
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
