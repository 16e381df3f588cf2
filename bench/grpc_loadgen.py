"""gRPC load generator for the serving benchmark (KServe v2 ``ModelInfer``), always in its own process.

``run_grpc_load`` starts ``python -m bench.grpc_loadgen``: an asyncio client (grpc.aio, on
uvloop when installed) with ``concurrency`` callers spread over ``channels`` channels (one
HTTP/2 connection each), every caller sending the same serialized ``ModelInferRequest``
back to back for ``duration_s``. The request is serialized once and sent as bytes, and the
answer is not parsed (only its status counted), so the client spends its CPU on gRPC itself,
as ``ghz`` would (no Debian package of it exists).

The result has the shape of ``bench.loadgen``'s: ``requests``, ``errors`` (any status but
OK), ``seconds``, ``rps``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``max_ms``, ``tool`` and
``cpu_s`` (the generator's own CPU time).

Usage: ``python -m bench.grpc_loadgen HOST:PORT --request-file F [--concurrency 64]
[--channels 8] [--duration-s 5] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loadgen import MAX_DURATION_S, LoadGenError, children_cpu_s, load_result, percentile, run_and_write

#: The KServe v2 inference call.
METHOD = "/inference.GRPCInferenceService/ModelInfer"


async def run_grpc_client(
    target: str, request: bytes, concurrency: int, channels: int, duration_s: float
) -> dict[str, Any]:
    """The client, in this process (``run_grpc_load`` starts it in its own)."""
    import grpc

    opened = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, min(channels, concurrency)))
    ]
    calls = [ch.unary_unary(METHOD, None, None) for ch in opened]  # bytes in, bytes out: no (de)serializing here
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + min(duration_s, MAX_DURATION_S)

    async def caller(i: int) -> None:
        nonlocal errors
        call = calls[i % len(calls)]
        while (t0 := time.perf_counter()) < deadline:
            try:
                await call(request, timeout=30)
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    try:
        for ch in opened:
            await asyncio.wait_for(ch.channel_ready(), 10)
        started = time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
        seconds = time.perf_counter() - started
    finally:
        for ch in opened:
            await ch.close(None)
    latencies.sort()
    ms = [x * 1e3 for x in (percentile(latencies, 50), percentile(latencies, 90), percentile(latencies, 99))]
    result = load_result(
        "grpc", len(latencies), errors, seconds, ms[0], ms[1], ms[2], latencies[-1] * 1e3 if latencies else 0.0
    )
    result.update(concurrency=concurrency, channels=len(opened))
    return result


def run_grpc_load(
    target: str, request: bytes, *, concurrency: int, channels: int = 8, duration_s: float = 5.0
) -> dict[str, Any]:
    """Send the serialized ``ModelInferRequest`` ``request`` to ``target`` from another process."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    duration_s = min(duration_s, MAX_DURATION_S)
    cpu_before = children_cpu_s()
    with tempfile.TemporaryDirectory(prefix="grpc-loadgen-") as tmp:
        body, out = Path(tmp) / "request.bin", Path(tmp) / "result.json"
        body.write_bytes(request)
        cmd = [
            sys.executable, "-m", "bench.grpc_loadgen", target, "--request-file", str(body), "--concurrency",
            str(concurrency), "--channels", str(channels), "--duration-s", str(duration_s), "--json", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60, check=False)
        if done.returncode != 0 or not out.is_file():
            raise LoadGenError(f"gRPC load generator exited with {done.returncode}: {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
    result["cpu_s"] = round(children_cpu_s() - cpu_before, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    """The client as a process: run, write the result JSON (stdout without ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="HOST:PORT of a KServe v2 gRPC server")
    parser.add_argument("--request-file", type=Path, required=True, help="a serialized ModelInferRequest")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    coro = run_grpc_client(
        args.target, args.request_file.read_bytes(), args.concurrency, args.channels, args.duration_s
    )
    return run_and_write(coro, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
