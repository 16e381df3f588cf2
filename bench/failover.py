"""Failover benchmark: how fast central notices a dead or frozen edge, and whether
clients of the gateway notice at all.

A private Mosquitto on a free loopback port, one central and three edges (real
processes), every edge heartbeating every ``--interval`` seconds. The digits classifier
is pushed with its calibration file (central serves it INT8), with small chunks so the
version has a few dozen of them. Once every edge serves it and central's membership
lists all three alive with the model ready (the gateway's candidates come from the
heartbeats), a client streams inference requests through central's gateway
(``POST /v2/models/digits/infer``, ``--concurrency`` sequential streams) and records
each result. Then:

1. ``SIGKILL`` one edge. ``kill_detect_s``: from just before the kill to the arrival of
   central's ``node_dead`` event for it on the broker's ``modelfleet/v1/events`` topic
   (the Last Will: the kernel closes the socket, the broker publishes the will at once).
   Then ``chunks_fully_owned_after_kill``: the killed node left the ring and every chunk
   of the version has ``min(R, live nodes)`` live owners (R = 2), from ``/api/v1/nodes``.
2. ``SIGSTOP`` a second edge: its sockets stay open, it just says nothing.
   ``freeze_detect_s``: from the stop to its ``node_dead`` event (heartbeat timeout,
   ``dead_after`` × interval after its last heartbeat; or the broker's keep-alive will).
3. Keep streaming, then ``SIGCONT`` it and wait for it to rejoin (``rejoin_s``).

``gateway_requests`` and ``gateway_errors`` (non-200 answers and exceptions) cover the
whole stream; ``max_gap_s`` is the longest time between two successful responses.

Gateway timeouts: a frozen edge accepts TCP connections (the kernel does) but never
answers, so a request routed to it waits ``gateway.read_timeout_s`` (default 5 s) before
the gateway retries on another node. The bench sets
``MODELFLEET_GATEWAY__READ_TIMEOUT_S`` (``--gateway-read-timeout-s``, 1.0 by default;
0 keeps central's default) and reports what it used.

Usage: ``python -m bench.failover --json out.json [--interval 1.0] [--duration-s 4]
[--concurrency 2] [--gateway-read-timeout-s 1.0]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._broker import Received, Recorder
from bench._fleet import Fleet, parse_env_pairs, sigterm_raises, write_result
from fleetwire.manifest import Manifest
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker
from modelfleet.zoo import build_digits

TARGETS: dict[str, float] = {"kill_detect_s": 1.0, "freeze_detect_s": 3.5, "gateway_errors": 0}
MODEL = "digits"
VERSION = "v1"
REPLICAS = 2
EDGES = 3
EVENTS_TOPIC = "modelfleet/v1/events"
#: Small chunks, so the 20-70 KB digits model is a few dozen chunks and ownership means something.
CHUNKING_ENV = {
    "MODELFLEET_CHUNKING__AVG_BYTES": "2048",
    "MODELFLEET_CHUNKING__MIN_BYTES": "512",
    "MODELFLEET_CHUNKING__MAX_BYTES": "8192",
}
_POLL_S = 0.05


@dataclass
class Result:
    """One client request: monotonic start and end, status (0 on an exception), serving node."""

    start: float
    end: float
    status: int
    node: str | None = None
    error: str | None = None


@dataclass
class StreamClient:
    """``concurrency`` threads, each sending requests one after another until ``stop``."""

    url: str
    bodies: list[bytes]
    concurrency: int = 2
    timeout_s: float = 30.0
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        """Start the streams."""
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(i,), name=f"failover-client-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the streams and wait for their last requests."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def _run(self, index: int) -> None:
        headers = {"content-type": "application/json"}
        with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
            i = index
            while not self._stop.is_set():
                body = self.bodies[i % len(self.bodies)]
                i += self.concurrency
                t0 = time.monotonic()
                try:
                    r = client.post(self.url, content=body, headers=headers)
                    res = Result(t0, time.monotonic(), r.status_code, r.headers.get("x-modelfleet-node"))
                    if r.status_code != 200:
                        res.error = r.text[:300]
                except httpx.HTTPError as exc:
                    res = Result(t0, time.monotonic(), 0, None, f"{type(exc).__name__}: {exc}"[:300])
                with self._lock:
                    self.results.append(res)

    def snapshot(self) -> list[Result]:
        """The results so far."""
        with self._lock:
            return list(self.results)


def oip_bodies(test_x: Any, input_name: str, count: int = 32) -> list[bytes]:
    """OIP v2 JSON requests of one row each."""
    bodies = []
    for row in test_x[:count]:
        doc = {"inputs": [{"name": input_name, "datatype": "FP32", "shape": [1, int(row.size)], "data": row.tolist()}]}
        bodies.append(json.dumps(doc).encode())
    return bodies


def max_gap(results: list[Result], since: float, until: float) -> float:
    """Longest time between two successful responses (ends), and from ``since`` to the
    first and the last to ``until``: a stream that stalls at the end counts too."""
    ends = sorted(r.end for r in results if r.status == 200 and since <= r.end <= until)
    marks = [since, *ends, until]
    return max((b - a for a, b in itertools.pairwise(marks)), default=until - since)


def _is_event(kind: str, node_id: str) -> Callable[[Received], bool]:
    def check(m: Received) -> bool:
        try:
            doc = m.json()
        except ValueError:
            return False
        return isinstance(doc, dict) and doc.get("type") == kind and doc.get("node_id") == node_id

    return check


def wait_membership_ready(fleet: Fleet, nodes: set[str], model: str, timeout_s: float) -> float:
    """Until central's membership lists every one of ``nodes`` alive with ``model`` ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = fleet.membership()
        ready = {
            n["node_id"]
            for n in doc["nodes"]
            if n["state"] == "alive" and any(m["name"] == model and m["state"] == "ready" for m in n["models"])
        }
        if nodes <= ready:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise fleet.fail(f"membership not ready after {timeout_s}s: {doc['nodes']}")
        time.sleep(_POLL_S)


def chunk_ownership(fleet: Fleet, chunks: int, gone: set[str]) -> dict[str, Any]:
    """Whether every chunk of the (only) version has min(R, live) live owners, from the ring."""
    ring = fleet.nodes()
    alive = {n["node_id"] for n in fleet.membership()["nodes"] if n["state"] == "alive"}
    owned = {n["node_id"]: int(n["owned_chunks"]) for n in ring}
    want = min(REPLICAS, len(ring))
    ok = (
        not (gone & set(owned))
        and set(owned) <= alive
        and all(v <= chunks for v in owned.values())
        # owners of one chunk are distinct and at most R: the sum is R × chunks only if each has R
        and sum(owned.values()) == want * chunks
        and want == REPLICAS
    )
    return {"ok": ok, "ring": sorted(owned), "owned_chunks": owned, "chunks": chunks, "owners_per_chunk": want}


def wait_chunks_owned(fleet: Fleet, chunks: int, gone: set[str], timeout_s: float) -> tuple[dict[str, Any], float]:
    """Poll until ``chunk_ownership`` holds (placement follows membership at once, but the
    ring update and the REST read race); returns the last check and how long it took."""
    t0 = time.monotonic()
    while True:
        check = chunk_ownership(fleet, chunks, gone)
        if check["ok"] or time.monotonic() - t0 > timeout_s:
            return check, time.monotonic() - t0
        time.sleep(_POLL_S)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the fleet, stream, kill one edge, freeze another; measure."""
    digits = build_digits()
    bodies = oip_bodies(digits.test_x, digits.input_name)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    detect_timeout = max(15.0, 10 * args.interval)
    errors: list[str] = []
    with MosquittoBroker(log=BENCH_LOG) as broker:
        central_env = {
            "MODELFLEET_MQTT__ENABLED": "true",
            "MODELFLEET_BROKER__HOST": broker.host,
            "MODELFLEET_BROKER__PORT": str(broker.port),
            **CHUNKING_ENV,
        }
        if args.gateway_read_timeout_s > 0:
            central_env["MODELFLEET_GATEWAY__READ_TIMEOUT_S"] = str(args.gateway_read_timeout_s)
        central_env.update(parse_env_pairs(args.central_env))
        edge_env = {
            "MODELFLEET_HEARTBEAT__ENABLED": "true",
            "MODELFLEET_BROKER__HOST": broker.host,
            "MODELFLEET_BROKER__PORT": str(broker.port),
            "MODELFLEET_HEARTBEAT__INTERVAL_S": str(args.interval),
            **parse_env_pairs(args.edge_env),
        }
        log(f"broker {broker.host}:{broker.port}; {EDGES} edges, heartbeat {args.interval}s; {os.cpu_count()} CPUs")
        with (
            Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet,
            Recorder(broker.host, broker.port, EVENTS_TOPIC) as events,
        ):
            fleet.start(edges=EDGES)
            pushed = fleet.push_files(MODEL, VERSION, digits.onnx_path, calibration=digits.calibration_path)
            manifest = pushed.manifest
            # Every chunk placement places: all files of every artifact the manifest offers.
            chunks = len(Manifest.model_validate(manifest).unique_chunks())
            log(f"pushed {MODEL}:{VERSION}: {manifest.get('artifact')} {manifest['size']} bytes, {chunks} chunks")
            for node in fleet.edges:
                fleet.wait_model_ready(node, MODEL, timeout_s=args.timeout_s)
            wait_membership_ready(fleet, set(fleet.edges), MODEL, args.timeout_s)
            before = chunk_ownership(fleet, chunks, set())
            killed, frozen = sorted(fleet.edges)[:2]
            assert fleet.central is not None
            client = StreamClient(f"{fleet.central.http_url}/v2/models/{MODEL}/infer", bodies, args.concurrency)
            stream_start = time.monotonic()
            client.start()
            stopped = False
            try:
                time.sleep(args.duration_s)
                # 1. SIGKILL
                mark = len(events.messages)
                t_kill = time.monotonic()
                fleet.edges[killed].popen.send_signal(signal.SIGKILL)
                dead = events.wait_for(_is_event("node_dead", killed), detect_timeout, mark)
                kill_detect_s = None if dead is None else dead.at - t_kill
                fleet.edges[killed].popen.wait(timeout=10)
                if dead is None:
                    errors.append(f"{killed} not declared dead within {detect_timeout}s of SIGKILL")
                log(f"SIGKILL {killed}: dead after {_fmt(kill_detect_s)} s")
                owned, owned_after_s = wait_chunks_owned(fleet, chunks, {killed}, 5.0)
                log(f"chunks fully owned after kill: {owned['ok']} ({owned['owned_chunks']}, {owned_after_s:.2f} s)")
                time.sleep(args.duration_s)
                # 2. SIGSTOP
                mark = len(events.messages)
                t_stop = time.monotonic()
                fleet.edges[frozen].popen.send_signal(signal.SIGSTOP)
                suspect = events.wait_for(_is_event("node_suspect", frozen), detect_timeout, mark)
                dead = events.wait_for(_is_event("node_dead", frozen), detect_timeout, mark)
                freeze_suspect_s = None if suspect is None else suspect.at - t_stop
                freeze_detect_s = None if dead is None else dead.at - t_stop
                if dead is None:
                    errors.append(f"{frozen} not declared dead within {detect_timeout}s of SIGSTOP")
                log(f"SIGSTOP {frozen}: suspect after {_fmt(freeze_suspect_s)} s, dead after {_fmt(freeze_detect_s)} s")
                time.sleep(args.duration_s)
                client.stop()
                stopped = True
                stream_end = time.monotonic()
            finally:
                if not stopped:
                    client.stop()
                fleet.edges[frozen].popen.send_signal(signal.SIGCONT)
            # 3. SIGCONT: the frozen edge finds its session gone and rejoins
            t_cont = time.monotonic()
            rejoined = events.wait_for(_is_event("node_rejoined", frozen), detect_timeout, mark)
            rejoin_s = None if rejoined is None else rejoined.at - t_cont
            log(f"SIGCONT {frozen}: rejoined after {_fmt(rejoin_s)} s")
            rest_events = fleet.events()
            gateway = fleet.client.get(fleet.central.http_url + "/api/v1/gateway").json()
            timeline = [
                {"t_s": round(m.at - stream_start, 3), **m.json()} for m in events.messages if m.topic == EVENTS_TOPIC
            ]
    results = client.snapshot()
    failed = [r for r in results if r.status != 200]
    gap = max_gap(results, stream_start, stream_end)
    latencies = sorted(r.end - r.start for r in results if r.status == 200)
    by_node: dict[str, int] = {}
    for r in results:
        if r.status == 200 and r.node:
            by_node[r.node] = by_node.get(r.node, 0) + 1
    figures: dict[str, Any] = {
        "kill_detect_s": _round(kill_detect_s),
        "freeze_detect_s": _round(freeze_detect_s),
        "gateway_errors": len(failed),
    }
    met = {
        "kill_detect_s": kill_detect_s is not None and kill_detect_s <= TARGETS["kill_detect_s"],
        "freeze_detect_s": freeze_detect_s is not None and freeze_detect_s <= TARGETS["freeze_detect_s"],
        "gateway_errors": len(failed) <= TARGETS["gateway_errors"],
    }
    return {
        "heartbeat_interval_s": args.interval,
        **figures,
        "freeze_suspect_s": _round(freeze_suspect_s),
        "rejoin_s": _round(rejoin_s),
        "gateway_requests": len(results),
        "max_gap_s": round(gap, 3),
        "latency_p50_s": _round(latencies[len(latencies) // 2] if latencies else None),
        "latency_max_s": _round(latencies[-1] if latencies else None),
        "served_by": by_node,
        "error_samples": [
            {"t_s": round(r.start - stream_start, 3), "status": r.status, "error": r.error} for r in failed[:10]
        ],
        "chunks_fully_owned_after_kill": bool(owned["ok"]),
        "chunk_ownership": {"before_kill": before, "after_kill": owned, "after_kill_s": round(owned_after_s, 3)},
        "killed": killed,
        "frozen": frozen,
        "artifact": manifest.get("artifact"),
        "chunks": chunks,
        "targets": dict(TARGETS),
        "met": {**met, "all": all(met.values())},
        "errors": errors,
        "gateway": {"stats": gateway.get("stats"), "read_timeout_s": args.gateway_read_timeout_s or None},
        "events": rest_events,
        "timeline": timeline,
        "settings": {
            "duration_s": args.duration_s,
            "concurrency": args.concurrency,
            "central_env": central_env,
            "edge_env": edge_env,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(result: dict[str, Any]) -> None:
    """Figures against targets."""
    t, met = result["targets"], result["met"]
    rows = [
        ("kill_detect_s", _fmt(result["kill_detect_s"]), f"<= {t['kill_detect_s']}", met["kill_detect_s"]),
        ("freeze_detect_s", _fmt(result["freeze_detect_s"]), f"<= {t['freeze_detect_s']}", met["freeze_detect_s"]),
        ("gateway_errors", str(result["gateway_errors"]), f"<= {t['gateway_errors']}", met["gateway_errors"]),
    ]
    print(f"{'figure':<18} {'value':>10} {'target':>10}")
    for name, value, target, ok in rows:
        print(f"{name:<18} {value:>10} {target:>10}  {'met' if ok else 'MISSED'}")
    print(
        f"gateway_requests {result['gateway_requests']}, max_gap_s {result['max_gap_s']}, "
        f"freeze_suspect_s {_fmt(result['freeze_suspect_s'])}, rejoin_s {_fmt(result['rejoin_s'])}, "
        f"chunks_fully_owned_after_kill {result['chunks_fully_owned_after_kill']}"
        + (f"\nerrors: {result['errors']}" if result["errors"] else "")
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--interval", type=float, default=1.0, help="edge heartbeat interval in seconds")
    p.add_argument("--duration-s", type=float, default=4.0, help="streaming before the kill, between, and after")
    p.add_argument("--concurrency", type=int, default=2, help="client request streams")
    p.add_argument(
        "--gateway-read-timeout-s", type=float, default=1.0,
        help="central's MODELFLEET_GATEWAY__READ_TIMEOUT_S (0: central's default, 5 s)",
    )  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=120.0, help="until the model must be served everywhere")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for the edges")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON (exit 1 if a detection never happened)."""
    args = build_parser().parse_args(argv)
    if args.interval <= 0 or args.duration_s < 0 or args.concurrency < 1 or args.timeout_s <= 0:
        print("--interval, --concurrency and --timeout-s must be positive, --duration-s not negative", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
