"""Benchmark: language models served by an edge over HTTP (issue 26), beside onnxruntime-genai
in process on the same folders, in the same run.

A central (quantization off: the folders are served as pushed) and one edge run as processes
(``bench._fleet``); this process is the client. The model is the zoo's random-weight Llama shape
(``--shape``, the ~200M one by default) written by ``modelfleet.zoo.llm``, pushed as FP32 and as
the 4-bit artifact central's weight-only quantizer makes (``int4-b32``, accuracy level 4). Then,
with greedy streams of ``--tokens`` tokens (EOS ignored) of ``/v1/completions``:

* ``int4_speedup``: single-stream decode tokens/s, 4-bit over FP32, same edge;
* ``single_ratio``: that 4-bit rate over onnxruntime-genai's at batch 1 on the same folder;
* ``batching_gain``: aggregate tokens/s of ``--clients`` concurrent streams over one stream's;
* ``engine_ratio``: that aggregate over onnxruntime-genai's static batch of ``--clients``;
* ``ttft_load_ratio``: TTFT p50 of probes while ``--clients`` - 1 streams run, over idle TTFT;
* ``prefix_ttft_ratio``: TTFT behind a ``--prefix``-token prefix already cached over cold;
* ``perplexity_ratio``, ``greedy_agreement``: the trained zoo model pushed to a quantizing
  central (in process) with its held-out text: the served artifact's figures from the guard;
* ``errors`` (whole run) and ``leaked_slots`` (running + waiting after ``--cancel`` streams
  hung up mid-way).

The CPU flags are in the result: INT4 MatMuls run in int8 (accuracy level 4) on AVX2/VNNI."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench._fleet import Fleet, parse_env_pairs, write_result
from bench._textload import (
    cancelled_streams,
    genai_rates,
    loaded_ttft,
    median,
    prompt_ids,
    stream,
    summary,
)
from bench.report import machine
from bench.zoo import cpu_flags
from central.quantize.llm.weight_only import TEXT_RECIPES, quantize_weights
from modelfleet.zoo.llm import SHAPES, write_random_llm

TARGETS = {
    "int4_speedup": 3.0, "single_ratio": 0.8, "batching_gain": 2.5, "engine_ratio": 0.8, "ttft_load_ratio": 3.0,
    "prefix_ttft_ratio": 0.3, "perplexity_ratio": 1.10, "greedy_agreement": 0.90, "errors": 0, "leaked_slots": 0,
}  # fmt: skip
#: Figures that must stay at or below their target (the others at or above).
AT_MOST = {"ttft_load_ratio", "prefix_ttft_ratio", "perplexity_ratio", "errors", "leaked_slots"}
_GAUGE = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} ([0-9.e+]+)$", re.M)


def build_models(work: Path, shape: str) -> tuple[Path, Path]:
    """The FP32 folder of ``shape`` and its 4-bit twin (central's ``int4-b32`` recipe)."""
    fp32 = write_random_llm(work / "fp32", SHAPES[shape])
    int4 = work / "int4"
    quantize_weights(fp32 / "model.onnx", int4 / "model.onnx", TEXT_RECIPES["int4-b32"], accuracy_level=4,
                     external_data_bytes=1 << 30)  # fmt: skip
    for companion in fp32.iterdir():
        if not companion.name.startswith("model.onnx"):
            shutil.copyfile(companion, int4 / companion.name)
    return fp32, int4


async def trained_figures(work: Path) -> dict[str, Any]:
    """The trained zoo model pushed with its held-out text to a quantizing central in this
    process: the served artifact and its text guard's perplexity ratio and greedy agreement."""
    from central.server import CentralServer
    from central.settings import CentralSettings
    from modelfleet.zoo.llm import eval_text, trained_llm

    settings = CentralSettings(data_dir=work / "trained-central", http_port=0, grpc_port=0, mqtt={"enabled": False})
    server = CentralServer(settings)
    await server.start()
    try:
        folder = trained_llm()
        files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
        files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
        files += [("eval", ("eval.txt", eval_text().encode()))]
        async with httpx.AsyncClient(base_url=server.http_url, timeout=600) as api:
            response = await api.post("/api/v1/models/zoo-llm/versions", files=files)
        response.raise_for_status()
    finally:
        await server.stop()
    served = response.json()["manifest"]["artifact"]
    guard = response.json()["report"]["quantization"]["candidates"].get(served, {}).get("text_guard", {})
    return {
        "artifact": served,
        "perplexity_ratio": (guard.get("perplexity_ratio") or {}).get("value"),
        "greedy_agreement": (guard.get("greedy_agreement") or {}).get("value"),
        "guard": guard,
    }


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every HTTP figure against the edge at ``url`` serving ``llm-int4`` and ``llm-fp32``."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60.0, read=600.0),
                                 limits=httpx.Limits(max_connections=4 * args.clients)) as client:  # fmt: skip
        streams = []
        for model in ("llm-int4", "llm-fp32"):  # warm-up: first runs allocate
            streams.append(await stream(client, model, prompt_ids(args.prompt, 1), 4))
        fp32 = await stream(client, "llm-fp32", prompt_ids(args.prompt, 2), args.tokens)
        single = await stream(client, "llm-int4", prompt_ids(args.prompt, 3), args.tokens)
        idle = [(await stream(client, "llm-int4", prompt_ids(args.prompt, 10 + i), 2)).ttft for i in range(5)]
        many = await asyncio.gather(*(stream(client, "llm-int4", prompt_ids(args.prompt, 100 + i), args.tokens)
                                      for i in range(args.clients)))  # fmt: skip
        loaded = await loaded_ttft(client, "llm-int4", args.clients, args.prompt, args.tokens)
        prefix = prompt_ids(args.prefix, 400)
        cold = await stream(client, "llm-int4", [*prefix, *prompt_ids(16, 401)], 1)
        cached = await stream(client, "llm-int4", [*prefix, *prompt_ids(16, 402)], 1)
        refused = await cancelled_streams(client, "llm-int4", args.cancel, args.tokens)
        streams += [fp32, single, cold, cached, *many]
        await asyncio.sleep(1.0)  # hung-up streams leave at the engine's next step
        metrics = (await client.get("/metrics")).text
    concurrent = summary(list(many))
    one = summary([single])
    return {
        "fp32_tokens_s": fp32.decode_rate,
        "int4_tokens_s": single.decode_rate,
        "one_client_tokens_s": one["rate"],
        "clients_tokens_s": concurrent["rate"],
        "idle_ttft_s": median(idle),
        "loaded_ttft_s": median(loaded),
        "prefix_cold_ttft_s": cold.ttft,
        "prefix_cached_ttft_s": cached.ttft,
        "errors": [s.error for s in streams if s.error] + (["cancelled stream refused"] * refused),
        "leaked_slots": int(sum(float(v) for v in _GAUGE.findall(metrics))),
    }


def figures(http: dict[str, Any], genai: tuple[float, float] | None, trained: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys from the measurements."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {
        "int4_speedup": ratio(http["int4_tokens_s"], http["fp32_tokens_s"]),
        "single_ratio": ratio(http["int4_tokens_s"], genai[0]) if genai else None,
        "batching_gain": ratio(http["clients_tokens_s"], http["one_client_tokens_s"]),
        "engine_ratio": ratio(http["clients_tokens_s"], genai[1]) if genai else None,
        "ttft_load_ratio": ratio(http["loaded_ttft_s"], http["idle_ttft_s"]),
        "prefix_ttft_ratio": ratio(http["prefix_cached_ttft_s"], http["prefix_cold_ttft_s"]),
        "perplexity_ratio": trained["perplexity_ratio"],
        "greedy_agreement": trained["greedy_agreement"],
        "errors": len(http["errors"]),
        "leaked_slots": http["leaked_slots"],
    }


def met(result: dict[str, Any]) -> dict[str, bool]:
    """Each key against its target (a figure not measured is not met)."""
    return {
        key: result[key] is not None and (result[key] <= target if key in AT_MOST else result[key] >= target)
        for key, target in TARGETS.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, serve, measure; the JSON the benchmark writes."""
    work = Path(tempfile.mkdtemp(prefix="bench-generate-", dir=args.work_dir))
    try:
        fp32, int4 = build_models(work, args.shape)
        genai = None if args.no_genai else genai_rates(int4, args.prompt, args.tokens, args.clients)
        trained = asyncio.run(trained_figures(work))
        edge_env = {"MODELFLEET_GENERATION__MAX_BATCH": str(args.clients),
                    "MODELFLEET_GENERATION__MAX_WAITING": str(4 * args.clients),
                    **parse_env_pairs(args.edge_env)}  # fmt: skip
        with Fleet(root=work, central_env={"MODELFLEET_QUANTIZE__ENABLED": "false"}, edge_env=edge_env) as fleet:
            fleet.start(edges=1)
            node = next(iter(fleet.edges))
            for name, folder in (("llm-int4", int4), ("llm-fp32", fp32)):
                fleet.push_folder(name, "1", folder)
                fleet.wait_model_ready(node, name)
            http = asyncio.run(measure(fleet.edges[node].http_url, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {"bench": "generate", **figures(http, genai, trained)}
    flags = cpu_flags()
    return {
        **result,
        "targets": TARGETS,
        "met": met(result),
        "measured": http,
        "genai": {"single_tokens_s": genai[0], "batch_tokens_s": genai[1]} if genai else None,
        "trained": trained,
        "shape": args.shape,
        "tokens": args.tokens,
        "prompt": args.prompt,
        "clients": args.clients,
        "prefix": args.prefix,
        "edge_env": parse_env_pairs(args.edge_env),
        "cpu_flags": flags,
        "machine": machine(),
        "cores": len(os.sched_getaffinity(0)),
    }


def print_table(result: dict[str, Any]) -> None:
    """Each key against its target, then the CPU."""
    for key, target in TARGETS.items():
        word = "<=" if key in AT_MOST else ">="
        print(f"{key:<20} {result[key]!s:>10}  (target {word} {target}) {'met' if result['met'][key] else 'MISSED'}")
    m = result["measured"]
    print(f"tokens/s: int4 {m['int4_tokens_s']:.1f}, fp32 {m['fp32_tokens_s']:.1f}, "
          f"{result['clients']} clients {m['clients_tokens_s']:.1f}; genai {result['genai']}")  # fmt: skip
    print(f"cpu flags: {' '.join(result['cpu_flags'])}; {result['machine']}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--shape", choices=sorted(SHAPES), default="200m", help="the zoo's random Llama shape")
    p.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream")
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients")
    p.add_argument("--prefix", type=int, default=1000, help="tokens of the shared prefix")
    p.add_argument("--cancel", type=int, default=100, help="streams hung up mid-way")
    p.add_argument("--no-genai", action="store_true", help="skip the onnxruntime-genai baseline")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temp dir goes")
    p.add_argument("--edge-env", nargs="*", default=[], metavar="K=V",
                   help="edge settings, e.g. MODELFLEET_GENERATION__SPINNING=false")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    args = build_parser().parse_args(argv)
    result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
