"""Central's event loop while PostgreSQL restarts: ``/healthz`` and the gateway must stay fast
when every store call fails or waits, because store calls run off the loop (issue 28).

Usage: ``python -m bench._ha_pg_restart --json out.json [--down-s 3] [--settle-s 2]
[--probe-hz 50] [--modes loop,threads]``

What runs (real processes on loopback): a private PostgreSQL and one central on it
(``store.url``; chunks in its data dir), twice: once per ``--modes`` entry, each a fresh
central on a fresh database. ``threads`` is the default central (store calls in
``store.threads`` worker threads); ``loop`` sets ``store.threads=0``, which runs them on the
event loop as central did before: the baseline, measured in the same run.

Timeline of one mode: a version pushed; then, throughout, store-touching traffic (four
threads listing models and versions, reading a manifest, asking ``/readyz`` and
``/metrics``; one pushing a small version every half second), a gateway client (inference on
the pushed model, which no node serves: each answer is a 503 that the gateway decides after
asking the registry whether the model exists) and a ``/healthz`` prober at ``--probe-hz``.
After ``--settle-s`` PostgreSQL is stopped (``pg_ctl stop -m fast``: every session cut),
kept down ``--down-s``, and started again; the outage window ends half a second after
``/readyz`` says the store is back. The prober is open-loop (a probe every ``1/hz`` s whether
or not the previous one answered), so a stalled loop shows in every probe sent while it stalls.

Keys: ``healthz_p99_ms_during_pg_restart`` (the ``threads`` mode: the figure with a target),
and per mode ``<mode>.healthz_p50_ms``/``p99_ms``/``max_ms`` over the outage window,
``<mode>.healthz_p99_ms_steady`` (before it), ``<mode>.gateway_p99_ms`` (outage window),
``<mode>.store_requests``, ``<mode>.store_503``, ``<mode>.store_500``, ``<mode>.recovered_s``
(restart → ``/readyz`` store check true); ``cpu_flags`` and ``machine`` say where it ran.
``healthz_p99_ms_before`` repeats the ``loop`` mode's figure when it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._fleet import Fleet, sigterm_raises, write_result
from bench.report import machine
from bench.zoo import cpu_flags
from modelfleet.up.postgres import PostgresInstance
from modelfleet.zoo.synthetic import build_mlp

TARGETS = {"healthz_p99_ms_during_pg_restart": 50.0}
#: store.threads of each mode: 0 is the event loop (the baseline), None the default.
MODES: dict[str, str | None] = {"loop": "0", "threads": None}
_WIDTH = 16
#: The outage window runs from the stop until this long after ``/readyz`` found the store again.
_AFTER_S = 0.5


def _log(message: str) -> None:
    print(f"[pg_restart] {message}", file=sys.stderr, flush=True)


@dataclass
class Timed:
    """(monotonic time sent, seconds taken, status) of every request one client made."""

    samples: list[tuple[float, float, int]] = field(default_factory=list)

    def window(self, start: float, end: float) -> list[float]:
        return [took for sent, took, _ in self.samples if start <= sent <= end]

    def statuses(self, start: float, end: float) -> list[int]:
        return [status for sent, _, status in self.samples if start <= sent <= end]


def _probe(stop: threading.Event, hz: float, timed: Timed, url: str) -> None:
    """``GET url`` every ``1/hz`` s whether or not the last one answered (open loop: a stalled
    server is caught by every probe sent while it stalls, not by one that waits it out)."""

    async def one(client: httpx.AsyncClient) -> None:
        sent = time.monotonic()
        try:
            status = (await client.get(url)).status_code
        except httpx.HTTPError:
            status = 0
        timed.samples.append((sent, time.monotonic() - sent, status))

    async def run() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
            tasks = set()
            next_at = time.monotonic()
            while not stop.is_set():
                task = asyncio.create_task(one(client))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_at += 1 / hz
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*tasks)

    asyncio.run(run())


def _loop(stop: threading.Event, every_s: float, timed: Timed, call: Callable[[], int]) -> None:
    """Call ``call`` every ``every_s`` until ``stop``; a transport error counts as status 0."""
    while not stop.is_set():
        sent = time.monotonic()
        try:
            status = call()
        except httpx.HTTPError:
            status = 0
        timed.samples.append((sent, time.monotonic() - sent, status))
        stop.wait(max(0.0, every_s - (time.monotonic() - sent)))


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def _store_back(client: httpx.Client, url: str) -> bool:
    try:
        return bool(client.get(f"{url}/readyz").json()["checks"]["store"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def run_mode(pg: PostgresInstance, work: Path, threads: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """One central on a fresh database through one PostgreSQL restart; its figures."""
    env = {"MODELFLEET_STORE__URL": pg.fresh_database(), "MODELFLEET_QUANTIZE__ENABLED": "false"}
    if threads is not None:
        env["MODELFLEET_STORE__THREADS"] = threads
    variants = [build_mlp(work / f"v{k}.onnx", width=_WIDTH, hidden_layers=1, seed=k) for k in range(3)]
    with Fleet(root=work, central_env=env, log=_log) as fleet:
        url = fleet.start_central().http_url
        fleet.push("demo", "1", variants[0])
        stop = threading.Event()
        healthz, gateway, store = Timed(), Timed(), Timed()
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, _WIDTH], "data": [0.5] * _WIDTH}]}
        clients = [httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) for _ in range(7)]
        reads = ["/api/v1/models", "/api/v1/models/demo/versions", "/api/v1/models/demo/versions/1", "/readyz"]
        pushed = iter(range(1, 1 << 30))

        def push() -> int:
            k = next(pushed)
            content = variants[k % len(variants)].read_bytes()
            r = clients[5].post(
                f"{url}/api/v1/models/demo/versions",
                content=content,
                headers={"Content-Type": "application/octet-stream"},
            )
            return r.status_code

        jobs: list[tuple[float, Timed, Callable[[], int]]] = [
            (0.05, gateway, lambda: clients[0].post(f"{url}/v2/models/demo/infer", json=body).status_code),
            *[(0.05, store, lambda c=clients[1 + i], p=p: c.get(f"{url}{p}").status_code) for i, p in enumerate(reads)],
            (0.5, store, push),
            (0.25, store, lambda: clients[6].get(f"{url}/metrics").status_code),
        ]
        workers = [threading.Thread(target=_loop, args=(stop, *job), daemon=True) for job in jobs]
        workers.append(threading.Thread(target=_probe, args=(stop, args.probe_hz, healthz, f"{url}/healthz")))
        for w in workers:
            w.start()
        t0 = time.monotonic()
        time.sleep(args.settle_s)
        down = time.monotonic()
        pg.stop_server()
        time.sleep(args.down_s)
        pg.start_again()
        restarted = time.monotonic()
        probe = httpx.Client(timeout=5.0)
        while not _store_back(probe, url) and time.monotonic() - restarted < 60:
            time.sleep(0.02)
        recovered = time.monotonic()
        end = recovered + _AFTER_S
        time.sleep(args.settle_s)
        stop.set()
        for w in workers:
            w.join(timeout=60)
        for c in [*clients, probe]:
            c.close()
    outage = healthz.window(down, end)
    statuses = store.statuses(down, end)
    return {
        "healthz_p50_ms": _ms(outage, 50),
        "healthz_p99_ms": _ms(outage, 99),
        "healthz_max_ms": _ms(outage, 100),
        "healthz_probes": len(outage),
        "healthz_failed": sum(s != 200 for s in healthz.statuses(down, end)),
        "healthz_p99_ms_steady": _ms(healthz.window(t0, down), 99),
        "gateway_p99_ms": _ms(gateway.window(down, end), 99),
        "gateway_requests": len(gateway.window(down, end)),
        "store_requests": len(statuses),
        "store_503": sum(s == 503 for s in statuses),
        "store_500": sum(s >= 500 and s != 503 for s in statuses),
        "recovered_s": round(recovered - restarted, 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode in a work directory of its own, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="pg-restart-") as work:
        return _run(args, Path(work))


def _run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    modes: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    with PostgresInstance() as pg:
        for mode in args.modes:
            _log(f"mode {mode}: central with store.threads={MODES[mode] or 'default'}")
            modes[mode] = figures = run_mode(pg, work / mode, MODES[mode], args)
            _log(f"mode {mode}: {figures}")
            if figures["store_500"]:
                errors.append(f"{mode}: {figures['store_500']} store-touching requests answered 5xx other than 503")
    result: dict[str, Any] = {
        "bench": "ha_pg_restart",
        "machine": machine(),
        "cpu_flags": cpu_flags(),
        "down_s": args.down_s,
        "probe_hz": args.probe_hz,
        "modes": modes,
        "healthz_p99_ms_during_pg_restart": modes.get("threads", {}).get("healthz_p99_ms"),
        "healthz_p99_ms_before": modes.get("loop", {}).get("healthz_p99_ms"),
        "errors": errors,
    }
    value = result["healthz_p99_ms_during_pg_restart"]
    met = {key: value is not None and value <= target for key, target in TARGETS.items()}
    result["targets"] = dict(TARGETS)
    result["met"] = {**met, "all": all(met.values())}
    return result


def merge_into(result: dict[str, Any], section: dict[str, Any]) -> None:
    """Add this benchmark's ``section`` to another's ``result`` (``bench.central_ha
    --pg-restart``): its figure and target beside the others, the rest under ``pg_restart``."""
    key = "healthz_p99_ms_during_pg_restart"
    result["pg_restart"] = {k: v for k, v in section.items() if k not in ("machine", "cpu_flags", "targets", "met")}
    result[key] = section[key]
    result["healthz_p99_ms_before"] = section["healthz_p99_ms_before"]
    result["targets"][key] = TARGETS[key]
    result["met"][key] = section["met"][key]
    result["met"]["all"] = all(v for k, v in result["met"].items() if k != "all")
    result["errors"] = [*result["errors"], *section["errors"]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of this benchmark (``bench.central_ha --pg-restart`` takes them too)."""
    p.add_argument("--down-s", type=float, default=3.0, help="How long PostgreSQL stays stopped.")
    p.add_argument("--settle-s", type=float, default=2.0, help="Traffic before the stop and after recovery.")
    p.add_argument("--probe-hz", type=float, default=50.0, help="/healthz probes per second.")
    p.add_argument(
        "--modes",
        type=lambda s: [m for m in s.split(",") if m],
        default=list(MODES),
        help="Comma-separated: loop (store.threads=0, the baseline), threads (the default).",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench._ha_pg_restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True, help="Where to write the result.")
    add_arguments(p)
    return p


def print_table(r: dict[str, Any]) -> None:
    print(f"ha_pg_restart: PostgreSQL down {r['down_s']} s under load ({r['machine']})")
    for mode, figures in r["modes"].items():
        print(f"  {mode}:")
        for key, value in figures.items():
            print(f"    {key:28} {value!s:>10}")
    value, target = r["healthz_p99_ms_during_pg_restart"], TARGETS["healthz_p99_ms_during_pg_restart"]
    verdict = "met" if r["met"]["healthz_p99_ms_during_pg_restart"] else "MISSED"
    print(f"  healthz_p99_ms_during_pg_restart {value!s:>10}  target ≤ {target}  {verdict}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        print(f"--modes: choose from {', '.join(MODES)} (got {unknown or 'none'})", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
