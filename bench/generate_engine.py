"""Generation engine benchmark, in process: the engine against onnxruntime-genai on one model folder.

On a GenAI-layout folder (the ~200M Llama shape for the issue's figures): single-stream decode
tokens/s, aggregate tokens/s with 16 concurrent streams, TTFT on an idle engine and with 15
streams running, TTFT of a prompt behind a 1,000-token prefix cold and cached; beside them
onnxruntime-genai in the same process on the same folder, batch 1 and a static batch of 16.
Engine and onnxruntime-genai take turns within each repeat and the median of the repeats is
kept, so a neighbour's load hits both alike. No HTTP: this is the engine's own ceiling (the
``bench.generate`` benchmark measures the edge over HTTP).

Usage: ``python -m bench.generate_engine --model DIR [--json out.json] [--tokens 64]
[--prompt 32] [--clients 16] [--repeats 3] [--threads 0] [--pin] [--no-genai]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.zoo import cpu_flags
from edge_node.generation import EngineSettings, GenerationEngine, SamplingParams

TARGETS = {
    "single_ratio": 0.8,
    "engine_ratio": 0.8,
    "batching_gain": 2.5,
    "ttft_load_ratio": 3.0,
    "prefix_ttft_ratio": 0.3,
}


#: Token ids prompts are drawn from (below every benchmarked vocabulary, above the special tokens).
PROMPT_IDS = (10, 500)


def _prompt(length: int, salt: int) -> list[int]:
    """``length`` token ids that differ per ``salt`` (the prefix cache must not join them)."""
    rng = np.random.default_rng(salt)
    return [int(t) for t in rng.integers(*PROMPT_IDS, length)]


async def _stream(engine: GenerationEngine, prompt: list[int], tokens: int) -> tuple[float, float, float, int]:
    """(start, first token, end, tokens) of one greedy stream."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start, first, count = time.perf_counter(), 0.0, 0
    async for step in engine.generate(prompt, params, "bench"):
        count += len(step.token_ids)
        first = first or time.perf_counter()
    return start, first, time.perf_counter(), count


async def _engine_round(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> dict[str, float]:
    one = await _stream(engine, _prompt(args.prompt, salt), args.tokens)
    single = (one[3] - 1) / (one[2] - one[1])
    idle_ttft = one[1] - one[0]
    t0 = time.perf_counter()
    many = await asyncio.gather(
        *(_stream(engine, _prompt(args.prompt, salt * 100 + i), args.tokens) for i in range(args.clients))
    )
    aggregate = sum(m[3] for m in many) / (max(m[2] for m in many) - t0)
    return {
        "single": single,
        "aggregate": aggregate,
        "idle_ttft": idle_ttft,
        "loaded_ttft": await _loaded_ttft(engine, args, salt),
    }


async def _loaded_ttft(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> float:
    """TTFT p50 of probes sent while ``clients - 1`` long streams decode."""
    long = [
        asyncio.create_task(_stream(engine, _prompt(args.prompt, salt * 1000 + i), 4 * args.tokens))
        for i in range(args.clients - 1)
    ]
    while engine.stats().running < args.clients - 1:
        await asyncio.sleep(0.01)
    ttfts = []
    for i in range(5):
        probe = await _stream(engine, _prompt(args.prompt, salt * 7000 + i), 2)
        ttfts.append(probe[1] - probe[0])
    for task in long:
        task.cancel()
    await asyncio.gather(*long, return_exceptions=True)
    return statistics.median(ttfts)


async def _prefix_ttft(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> tuple[float, float]:
    prefix = _prompt(args.prefix, salt + 500)
    cold = await _stream(engine, [*prefix, *_prompt(16, salt + 1)], 1)
    cached = await _stream(engine, [*prefix, *_prompt(16, salt + 2)], 1)
    return cold[1] - cold[0], cached[1] - cached[0]


def _genai_round(model: Any, args: argparse.Namespace, og: Any) -> dict[str, float]:
    def run(batch: int) -> tuple[float, float]:
        params = og.GeneratorParams(model)
        total = args.prompt + args.tokens
        params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=batch)
        generator = og.Generator(model, params)
        ids = np.stack([np.asarray(_prompt(args.prompt, i), dtype=np.int32) for i in range(batch)])
        t0 = time.perf_counter()
        generator.append_tokens(ids)
        generator.generate_next_token()
        first, steps = time.perf_counter(), 1
        while not generator.is_done():
            generator.generate_next_token()
            steps += 1
        end = time.perf_counter()
        return (steps - 1) / (end - first), batch * steps / (end - t0)

    single, _ = run(1)
    _, aggregate = run(args.clients)
    return {"single": single, "aggregate": aggregate}


def _median(rounds: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the benchmark, as the JSON it writes."""
    settings = EngineSettings(max_batch=args.clients, intra_op_threads=args.threads, pin_threads=args.pin)
    engine = await asyncio.to_thread(GenerationEngine.load, args.model, settings)
    await engine.start()
    og: Any = None
    model: Any = None
    if not args.no_genai:
        import onnxruntime_genai

        og, config = onnxruntime_genai, onnxruntime_genai.Config(str(args.model))
        if args.threads:  # the same intra-op threads as the engine
            config.overlay(
                json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}})
            )
        model = og.Model(config)
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    prefix: list[tuple[float, float]] = []
    try:
        await _stream(engine, _prompt(args.prompt, 0), 4)  # warm-up
        for r in range(1, args.repeats + 1):
            ours.append(await _engine_round(engine, args, r))
            prefix.append(await _prefix_ttft(engine, args, r))
            if model is not None:
                theirs.append(await asyncio.to_thread(_genai_round, model, args, og))
    finally:
        await engine.stop()
    return _report(args, engine, ours, theirs, prefix)


def _report(
    args: argparse.Namespace,
    engine: GenerationEngine,
    ours: list[dict[str, float]],
    theirs: list[dict[str, float]],
    prefix: list[tuple[float, float]],
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "model": str(args.model),
        "cpu_flags": cpu_flags(),
        "threads": args.threads,
        "pinned": args.pin,
        "prompt_tokens": args.prompt,
        "tokens_per_stream": args.tokens,
        "clients": args.clients,
        "repeats": args.repeats,
        "engine_single_tps": _median(ours, "single"),
        "engine_aggregate_tps": _median(ours, "aggregate"),
        "ttft_idle_s": _median(ours, "idle_ttft"),
        "ttft_loaded_s": _median(ours, "loaded_ttft"),
        "prefix_tokens": args.prefix,
        "prefix_ttft_cold_s": statistics.median(p[0] for p in prefix),
        "prefix_ttft_cached_s": statistics.median(p[1] for p in prefix),
        "kv_bytes_per_token": engine.kv_bytes_per_token,
    }
    figures["batching_gain"] = figures["engine_aggregate_tps"] / figures["engine_single_tps"]
    figures["ttft_load_ratio"] = figures["ttft_loaded_s"] / figures["ttft_idle_s"]
    figures["prefix_ttft_ratio"] = figures["prefix_ttft_cached_s"] / figures["prefix_ttft_cold_s"]
    if theirs:
        figures["genai_single_tps"] = _median(theirs, "single")
        figures["genai_static_batch_tps"] = _median(theirs, "aggregate")
        figures["single_ratio"] = figures["engine_single_tps"] / figures["genai_single_tps"]
        figures["engine_ratio"] = figures["engine_aggregate_tps"] / figures["genai_static_batch_tps"]
    check: dict[str, Callable[[float, float], bool]] = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t}
    ways = {"ttft_load_ratio": "<=", "prefix_ttft_ratio": "<="}
    figures["targets"] = {k: v for k, v in TARGETS.items() if k in figures}
    figures["met"] = {k: check[ways.get(k, ">=")](figures[k], v) for k, v in figures["targets"].items()}
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print (and optionally write) its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GenAI-layout folder")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per stream")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream")
    parser.add_argument("--prefix", type=int, default=1000, help="shared prefix for the prefix-cache TTFT")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads of both (0: each one's default)")
    parser.add_argument("--pin", action="store_true", help="pin intra-op threads (EngineSettings.pin_threads)")
    parser.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
