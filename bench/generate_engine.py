"""Generation engine benchmark, in process: the engine against onnxruntime-genai on one model folder.

On a GenAI-layout folder (the ~200M Llama shape for the issue's figures): single-stream decode
tokens/s, aggregate tokens/s with 16 concurrent streams, TTFT on an idle engine and with 15
streams running, TTFT of a prompt behind a 1,000-token prefix cold and cached; beside them
onnxruntime-genai in the same process on the same folder, batch 1 and a static batch of 16.
Engine and onnxruntime-genai take turns within each repeat and the median of the repeats is
kept, so a neighbour's load hits both alike. No HTTP: this is the engine's own ceiling (the
``bench.generate`` benchmark measures the edge over HTTP).

With ``--fp32 DIR`` (the FP32 folder the ``--model`` artifact was quantized from) it also
measures the engine's single-stream decode on FP32 in the same run, one FP32 stream right after
one int4 stream each repeat: ``int4_speedup`` is the median of their ratios.
``--shape 200m`` makes both itself: the zoo's numpy writer (``modelfleet.zoo.llm``, random
weights) writes the FP32 folder, central's weight-only quantizer (``MatMulNBits``, 4 bits,
block 32, ``accuracy_level`` 4) the int4 one, into ``--workdir``.

Usage: ``python -m bench.generate_engine (--model DIR [--fp32 DIR] | --shape 200m [--workdir DIR])
[--json out.json] [--tokens 64] [--prompt 32] [--clients 16] [--repeats 3] [--threads 0] [--pin]
[--no-spin] [--skip-ttft] [--no-genai]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench._textload import genai_run, prompt_ids
from bench.zoo import cpu_flags
from edge_node.generation import EngineSettings, GenerationEngine, SamplingParams

TARGETS = {
    "single_ratio": 0.8,
    "engine_ratio": 0.8,
    "batching_gain": 2.5,
    "ttft_load_ratio": 3.0,
    "prefix_ttft_ratio": 0.3,
    "int4_speedup": 3.0,
}


async def _stream(engine: GenerationEngine, prompt: list[int], tokens: int) -> tuple[float, float, float, int]:
    """(start, first token, end, tokens) of one greedy stream."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start, first, count = time.perf_counter(), 0.0, 0
    async for step in engine.generate(prompt, params, "bench"):
        count += len(step.token_ids)
        first = first or time.perf_counter()
    return start, first, time.perf_counter(), count


async def _engine_round(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> dict[str, float]:
    one = await _stream(engine, prompt_ids(args.prompt, salt), args.tokens)
    single = (one[3] - 1) / (one[2] - one[1])
    idle_ttft = one[1] - one[0]
    t0 = time.perf_counter()
    many = await asyncio.gather(
        *(_stream(engine, prompt_ids(args.prompt, salt * 100 + i), args.tokens) for i in range(args.clients))
    )
    aggregate = sum(m[3] for m in many) / (max(m[2] for m in many) - t0)
    loaded = float("nan") if args.skip_ttft else await _loaded_ttft(engine, args, salt)
    return {"single": single, "aggregate": aggregate, "idle_ttft": idle_ttft, "loaded_ttft": loaded}


async def _loaded_ttft(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> float:
    """TTFT p50 of probes sent while ``clients - 1`` long streams decode."""
    long = [
        asyncio.create_task(_stream(engine, prompt_ids(args.prompt, salt * 1000 + i), 4 * args.tokens))
        for i in range(args.clients - 1)
    ]
    # Short streams (tiny --tokens) may end before the last one is admitted: wait for the
    # batch to fill, but no longer than one stream lasts or a few seconds.
    deadline = time.monotonic() + 5.0
    while engine.stats().running < args.clients - 1 and time.monotonic() < deadline:
        if any(task.done() for task in long):
            break
        await asyncio.sleep(0.01)
    ttfts = []
    for i in range(5):
        probe = await _stream(engine, prompt_ids(args.prompt, salt * 7000 + i), 2)
        ttfts.append(probe[1] - probe[0])
    for task in long:
        task.cancel()
    await asyncio.gather(*long, return_exceptions=True)
    return statistics.median(ttfts)


async def _prefix_ttft(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> tuple[float, float]:
    prefix = prompt_ids(args.prefix, salt + 500)
    cold = await _stream(engine, [*prefix, *prompt_ids(16, salt + 1)], 1)
    cached = await _stream(engine, [*prefix, *prompt_ids(16, salt + 2)], 1)
    return cold[1] - cold[0], cached[1] - cached[0]


def _genai_round(model: Any, args: argparse.Namespace, og: Any) -> dict[str, float]:
    single, _ = genai_run(og, model, args.prompt, args.tokens, 1)
    _, aggregate = genai_run(og, model, args.prompt, args.tokens, args.clients)
    return {"single": single, "aggregate": aggregate}


def _median(rounds: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def _settings(args: argparse.Namespace) -> EngineSettings:
    return EngineSettings(
        max_batch=args.clients, intra_op_threads=args.threads, pin_threads=args.pin, spinning=not args.no_spin
    )


async def _single(engine: GenerationEngine, args: argparse.Namespace, salt: int) -> float:
    """Single-stream decode tokens/s of one greedy stream."""
    one = await _stream(engine, prompt_ids(args.prompt, salt), args.tokens)
    return (one[3] - 1) / (one[2] - one[1])


async def _int4_round(
    engine: GenerationEngine, fp32: GenerationEngine, args: argparse.Namespace, salt: int
) -> dict[str, float]:
    """One int4 stream and one FP32 stream back to back, so a neighbour's load hits both alike."""
    quantized = await _single(engine, args, salt + 9000)
    full = await _single(fp32, args, salt + 9000)
    return {"fp32_single": full, "int4_speedup": quantized / full}


def write_shape(shape: str, workdir: Path) -> tuple[Path, Path]:
    """The zoo's random-weight ``shape`` in FP32 and its int4 (block 32, accuracy level 4)
    candidate, as GenAI folders under ``workdir``: (int4, fp32)."""
    from central.quantize.llm.weight_only import TEXT_RECIPES, quantize_weights
    from modelfleet.zoo.llm import write_random_llm

    fp32, int4 = workdir / f"{shape}-fp32", workdir / f"{shape}-int4"
    write_random_llm(fp32, shape)
    int4.mkdir(parents=True, exist_ok=True)
    for f in fp32.iterdir():
        if not f.name.startswith("model.onnx"):
            shutil.copy(f, int4 / f.name)
    quantize_weights(
        fp32 / "model.onnx",
        int4 / "model.onnx",
        TEXT_RECIPES["int4-b32"],
        accuracy_level=4,
        external_data_bytes=1 << 30,
    )
    return int4, fp32


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the benchmark, as the JSON it writes."""
    settings = _settings(args)
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
    fp32 = await asyncio.to_thread(GenerationEngine.load, args.fp32, settings) if args.fp32 else None
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    prefix: list[tuple[float, float]] = []
    speedups: list[dict[str, float]] = []
    try:
        await _stream(engine, prompt_ids(args.prompt, 0), 4)  # warm-up
        if fp32 is not None:
            await fp32.start()
            await _stream(fp32, prompt_ids(args.prompt, 0), 4)
        for r in range(1, args.repeats + 1):
            ours.append(await _engine_round(engine, args, r))
            if not args.skip_ttft:
                prefix.append(await _prefix_ttft(engine, args, r))
            if model is not None:
                theirs.append(await asyncio.to_thread(_genai_round, model, args, og))
            if fp32 is not None:
                speedups.append(await _int4_round(engine, fp32, args, r))
    finally:
        await engine.stop()
        if fp32 is not None:
            await fp32.stop()
    figures = _report(args, engine, ours, theirs, prefix)
    if speedups:
        figures["fp32_single_tps"] = _median(speedups, "fp32_single")
        figures["int4_speedup"] = _median(speedups, "int4_speedup")
    return _judge(figures)


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
        "spinning": not args.no_spin,
        "prompt_tokens": args.prompt,
        "tokens_per_stream": args.tokens,
        "clients": args.clients,
        "repeats": args.repeats,
        "engine_single_tps": _median(ours, "single"),
        "engine_aggregate_tps": _median(ours, "aggregate"),
        "ttft_idle_s": _median(ours, "idle_ttft"),
        "ttft_loaded_s": _median(ours, "loaded_ttft"),
        "kv_bytes_per_token": engine.kv_bytes_per_token,
    }
    figures["batching_gain"] = figures["engine_aggregate_tps"] / figures["engine_single_tps"]
    if prefix:
        figures["ttft_load_ratio"] = figures["ttft_loaded_s"] / figures["ttft_idle_s"]
        figures["prefix_tokens"] = args.prefix
        figures["prefix_ttft_cold_s"] = statistics.median(p[0] for p in prefix)
        figures["prefix_ttft_cached_s"] = statistics.median(p[1] for p in prefix)
        figures["prefix_ttft_ratio"] = figures["prefix_ttft_cached_s"] / figures["prefix_ttft_cold_s"]
    if theirs:
        figures["genai_single_tps"] = _median(theirs, "single")
        figures["genai_static_batch_tps"] = _median(theirs, "aggregate")
        figures["single_ratio"] = figures["engine_single_tps"] / figures["genai_single_tps"]
        figures["engine_ratio"] = figures["engine_aggregate_tps"] / figures["genai_static_batch_tps"]
    return figures


def _judge(figures: dict[str, Any]) -> dict[str, Any]:
    check: dict[str, Callable[[float, float], bool]] = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t}
    ways = {"ttft_load_ratio": "<=", "prefix_ttft_ratio": "<="}
    figures["targets"] = {k: v for k, v in TARGETS.items() if k in figures}
    figures["met"] = {k: check[ways.get(k, ">=")](figures[k], v) for k, v in figures["targets"].items()}
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print (and optionally write) its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a GenAI-layout folder")
    source.add_argument("--shape", help="write the zoo's random-weight shape (e.g. 200m) in FP32 and int4")
    parser.add_argument("--workdir", type=Path, help="where --shape writes its folders (default: a temporary one)")
    parser.add_argument("--fp32", type=Path, help="the FP32 folder --model was quantized from (int4_speedup)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per stream")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream")
    parser.add_argument("--prefix", type=int, default=1000, help="shared prefix for the prefix-cache TTFT")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads of both (0: each one's default)")
    parser.add_argument("--pin", action="store_true", help="pin intra-op threads (EngineSettings.pin_threads)")
    parser.add_argument("--no-spin", action="store_true", help="intra-op threads sleep when idle (no spinning)")
    parser.add_argument("--skip-ttft", action="store_true", help="only throughput: no loaded or prefix TTFT rounds")
    parser.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="generate-engine-") as scratch:
        if args.shape:
            args.model, args.fp32 = write_shape(args.shape, args.workdir or Path(scratch))
        figures = asyncio.run(run(args))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
