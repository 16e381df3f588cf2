"""Load for language models over HTTP: streams of ``POST /v1/completions`` (server-sent events)
timed token by token from another process than the edge's, and onnxruntime-genai in process on
the same folder as the baseline. ``bench.generate`` composes them."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

#: Token ids prompts are drawn from: above the special tokens, below every benchmarked vocabulary.
PROMPT_IDS = (10, 500)


def prompt_ids(length: int, salt: int) -> list[int]:
    """``length`` token ids that differ per ``salt`` (the prefix cache must not join them)."""
    return [int(t) for t in np.random.default_rng(salt).integers(*PROMPT_IDS, length)]


@dataclass(frozen=True)
class Stream:
    """One timed stream: when it was sent, its first and last token, how many tokens, and why it failed."""

    start: float
    first: float
    end: float
    tokens: int
    error: str | None = None

    @property
    def ttft(self) -> float:
        """Seconds to the first token."""
        return self.first - self.start

    @property
    def decode_rate(self) -> float:
        """Tokens per second after the first."""
        return (self.tokens - 1) / (self.end - self.first) if self.tokens > 1 and self.end > self.first else 0.0


async def stream(client: httpx.AsyncClient, model: str, prompt: list[int], tokens: int) -> Stream:
    """A greedy stream of exactly ``tokens`` tokens (EOS ignored), timed at each SSE chunk."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    first, count = 0.0, 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return Stream(start, start, time.perf_counter(), 0, f"{response.status_code} {response.text[:120]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if json.loads(line[6:]).get("choices"):
                    count += 1
                    first = first or time.perf_counter()
    except httpx.HTTPError as exc:
        return Stream(start, start, time.perf_counter(), count, f"{type(exc).__name__}: {exc}")
    return Stream(start, first or start, time.perf_counter(), count)


async def cancelled_streams(client: httpx.AsyncClient, model: str, count: int, tokens: int) -> int:
    """Open ``count`` streams and hang up on each after its first chunk; the failures to start."""
    failures = 0
    body = {"model": model, "prompt": prompt_ids(16, 99), "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    for _ in range(count):
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                failures += 1
                continue
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    break  # leaving the block closes the connection mid-stream
    return failures


async def loaded_ttft(client: httpx.AsyncClient, model: str, clients: int, prompt: int, tokens: int) -> list[float]:
    """TTFTs of five probes sent one after another while ``clients - 1`` long streams decode."""
    long = [asyncio.create_task(stream(client, model, prompt_ids(prompt, 5000 + i), 8 * tokens))
            for i in range(clients - 1)]  # fmt: skip
    await asyncio.sleep(1.0)  # the long ones admitted and decoding
    probes = [await stream(client, model, prompt_ids(prompt, 7000 + i), 2) for i in range(5)]
    for task in long:
        task.cancel()
    await asyncio.gather(*long, return_exceptions=True)
    return [p.ttft for p in probes if p.error is None]


def genai_run(og: Any, model: Any, prompt: int, tokens: int, rows: int) -> tuple[float, float]:
    """One greedy onnxruntime-genai run of ``rows`` prompts: (decode tokens/s of one row after its
    first token, aggregate tokens/s of all rows over the whole run)."""
    params = og.GeneratorParams(model)
    total = prompt + tokens
    params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=rows)
    generator = og.Generator(model, params)
    ids = np.stack([np.asarray(prompt_ids(prompt, i), dtype=np.int32) for i in range(rows)])
    t0 = time.perf_counter()
    generator.append_tokens(ids)
    generator.generate_next_token()
    first, steps = time.perf_counter(), 1
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    end = time.perf_counter()
    return (steps - 1) / (end - first), rows * steps / (end - t0)


def genai_rates(folder: Path, prompt: int, tokens: int, batch: int) -> tuple[float, float]:
    """onnxruntime-genai in this process on ``folder``: (single-stream decode tokens/s at batch 1,
    aggregate tokens/s of a static batch of ``batch``)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    single, _ = genai_run(og, model, prompt, tokens, 1)
    _, aggregate = genai_run(og, model, prompt, tokens, batch)
    return single, aggregate


def median(values: list[float]) -> float:
    """The median, 0 for none."""
    return statistics.median(values) if values else 0.0


def summary(streams: list[Stream]) -> dict[str, Any]:
    """Tokens, errors and the wall time of a set of concurrent streams."""
    ok = [s for s in streams if s.error is None]
    wall = max((s.end for s in ok), default=0.0) - min((s.start for s in ok), default=0.0)
    tokens = sum(s.tokens for s in ok)
    return {"tokens": tokens, "wall_s": wall, "rate": tokens / wall if wall > 0 else 0.0,
            "errors": [s.error for s in streams if s.error is not None]}  # fmt: skip
