"""Client load for a fleet of language models: timed streams with their token ids, multi-turn
conversations sharing one system prompt, sent in waves. ``bench.generate_fleet`` composes them.

Every stream asks for ``return_token_ids`` (the gateway passes them on), so a stream is known
by its tokens, not its text, and its time to first token is taken at the first chunk that
carries one (a chat stream's first, role-only chunk carries none)."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from bench._fleet import Fleet
from modelfleet.zoo.llm import eval_text

NODE_HEADER = "x-modelfleet-node"
#: Characters per token of the zoo tokenizer on words drawn from its text (measured: 2.66), to size prompts.
CHARS_PER_TOKEN = 2.66
_SAMPLE = re.compile(r"^([a-zA-Z_:]+)\{[^}]*\} ([0-9.e+-]+)$", re.M)
#: An edge's engine series summed by ``engine_counters``: what a stream's TTFT was spent on there.
ENGINE_SERIES = {
    "streams": "vllm:request_queue_time_seconds_count",
    "queue_s": "vllm:request_queue_time_seconds_sum",
    "admitted_to_first_s": "vllm:request_prefill_time_seconds_sum",
    "ttft_edge_s": "vllm:time_to_first_token_seconds_sum",
    "prefill_run_s": "modelfleet_generation_prefill_seconds_total",
    "decode_run_s": "modelfleet_generation_decode_seconds_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "prefilled_tokens": "modelfleet_generation_prefilled_tokens_total",
    "generated_tokens": "vllm:generation_tokens_total",
    "prefix_block_queries": "vllm:prefix_cache_queries_total",
    "prefix_block_hits": "vllm:prefix_cache_hits_total",
    "warmed_tokens": "modelfleet_generation_warmed_tokens_total",
    "warm_run_s": "modelfleet_generation_warm_seconds_total",
}


@dataclass
class Streamed:
    """One stream as the client saw it."""

    start: float
    first: float = 0.0
    end: float = 0.0
    node: str = ""
    """``X-Modelfleet-Node``: where it started (empty straight from an edge)."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ttft(self) -> float:
        """Seconds to the first chunk with a token."""
        return self.first - self.start if self.first else 0.0

    @property
    def broken(self) -> bool:
        """It failed, or ended without a finish reason."""
        return self.error is not None or self.finish_reason is None


def _take(out: Streamed, chunk: dict[str, Any]) -> None:
    """One SSE chunk (completion or chat) into ``out``."""
    if "error" in chunk:
        out.error = f"error event: {str(chunk['error'])[:200]}"
        return
    if chunk.get("usage"):
        out.usage = chunk["usage"]
    for choice in chunk.get("choices") or ():
        ids = choice.get("token_ids") or chunk.get("token_ids") or []
        if ids and not out.first:
            out.first = time.perf_counter()
        out.token_ids.extend(int(t) for t in ids)
        out.text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        out.finish_reason = choice.get("finish_reason") or out.finish_reason


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any], out: Streamed | None = None,
                 started: asyncio.Event | None = None, min_tokens: int = 1) -> Streamed:  # fmt: skip
    """POST ``body`` (made a stream with token ids and usage) to ``path``, filling in ``out`` as
    chunks come (so others can watch it); ``started`` is set once ``min_tokens`` tokens arrived."""
    body = {**body, "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    out = out or Streamed(time.perf_counter())
    out.start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            out.node = response.headers.get(NODE_HEADER, "")
            if response.status_code != 200:
                await response.aread()
                out.error = f"{response.status_code} {response.text[:200]}"
                return out
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    _take(out, orjson.loads(line[5:].strip()))
                    if started is not None and len(out.token_ids) >= min_tokens:
                        started.set()
    except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.end = time.perf_counter()
        if started is not None:
            started.set()  # whatever happened, nobody waits for it any longer
    return out


def greedy(model: str, tokens: int, **fields: Any) -> dict[str, Any]:
    """A greedy request body of exactly ``tokens`` tokens (EOS ignored)."""
    return {"model": model, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, **fields}


# -- conversations -------------------------------------------------------------------------


def _words() -> list[str]:
    return eval_text().split()


def text_of(tokens: int, rng: random.Random, words: Sequence[str]) -> str:
    """About ``tokens`` tokens of the zoo's text: words drawn at random (so no two differ late)."""
    out: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        out.append(rng.choice(words))
        size += len(out[-1]) + 1
    return " ".join(out)


@dataclass(frozen=True)
class ChatPlan:
    """A multi-turn chat workload: ``conversations`` sharing one system prompt, ``turns`` each."""

    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int
    seed: int = 0

    def system(self) -> str:
        """The shared system prompt."""
        return "You are a helpful assistant. " + text_of(self.system_tokens, random.Random(self.seed), _words())

    def users(self) -> list[list[str]]:
        """Per conversation, its user messages, one per turn."""
        words, rng = _words(), random.Random(self.seed + 1)
        return [[text_of(self.user_tokens, rng, words) for _ in range(self.turns)] for _ in range(self.conversations)]


@dataclass
class Turn:
    """One answered turn: which conversation and turn, and its stream."""

    conversation: int
    turn: int
    streamed: Streamed


class Conversations:
    """A ``ChatPlan``'s conversations, one wave at a time: every conversation's next turn at once,
    each turn's messages the conversation so far (the replies as the client got them)."""

    def __init__(self, plan: ChatPlan, model: str) -> None:
        self.plan, self.model = plan, model
        self._users = plan.users()
        self._history = [[{"role": "system", "content": plan.system()}] for _ in range(plan.conversations)]
        self.turns: list[Turn] = []
        """Every answered turn so far."""
        self.wall_s = 0.0
        """Seconds the waves took, from the first request of each to its last answer."""

    @property
    def done(self) -> int:
        """Waves sent so far."""
        return len(self.turns) // self.plan.conversations

    async def wave(self, client: httpx.AsyncClient, url: str) -> None:
        """Send the next turn of every conversation at once to ``url``'s chat completions; return
        when all have answered."""
        t = self.done
        for c, messages in enumerate(self._history):
            messages.append({"role": "user", "content": self._users[c][t]})
        # users do not answer in the same order every turn (in order, equal loads taking turns
        # would place each conversation where it was before by chance); seeded, so every run and
        # both policies see the same orders
        order = list(range(self.plan.conversations))
        random.Random(self.plan.seed * 1000 + t).shuffle(order)
        bodies = {c: greedy(self.model, self.plan.reply_tokens, messages=list(self._history[c])) for c in order}
        started = time.monotonic()
        answered = await asyncio.gather(*(stream(client, f"{url}/v1/chat/completions", bodies[c]) for c in order))
        self.wall_s += time.monotonic() - started
        for c, s in sorted(zip(order, answered, strict=True), key=lambda pair: pair[0]):
            self._history[c].append({"role": "assistant", "content": s.text})
            self.turns.append(Turn(c, t, s))


def chat_client(plan: ChatPlan) -> httpx.AsyncClient:
    """A client for a plan's waves: a connection per stream, reads as slow as a long queue."""
    limits = httpx.Limits(max_connections=4 * plan.conversations)
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0), limits=limits)


def engine_counters(metrics: str) -> dict[str, float]:
    """``ENGINE_SERIES`` of an edge's ``/metrics`` (every model summed; 0 for a series absent)."""
    names = {series: key for key, series in ENGINE_SERIES.items()}
    out = dict.fromkeys(ENGINE_SERIES, 0.0)
    for name, value in _SAMPLE.findall(metrics):
        if name in names:
            out[names[name]] += float(value)
    return out


def counters_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What ``engine_counters`` grew by between two readings."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def engine_breakdown(per_node: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The nodes' ``engine_counters`` deltas as one breakdown of the time to first token: the mean
    stream's wait for a row and its admission-to-first-token time (at the edge, over streams), the
    engine's seconds in prefill runs and decode steps, the share of prompt tokens that were not
    run (the prefix cache) and of prompt blocks looked up that were found."""
    total = {k: sum(c[k] for c in per_node.values()) for k in ENGINE_SERIES}
    streams = total["streams"] or 1.0
    return {
        "streams": int(total["streams"]),
        "queue_mean_s": round(total["queue_s"] / streams, 4),
        "admitted_to_first_mean_s": round(total["admitted_to_first_s"] / streams, 4),
        "ttft_edge_mean_s": round(total["ttft_edge_s"] / streams, 4),
        "prefill_run_s": round(total["prefill_run_s"], 3),
        "decode_run_s": round(total["decode_run_s"], 3),
        "prefilled_tokens": int(total["prefilled_tokens"]),
        "warmed_tokens": int(total["warmed_tokens"]),
        "warm_run_s": round(total["warm_run_s"], 3),
        "prompt_tokens": int(total["prompt_tokens"]),
        "prefill_s_per_token_ms": round(1000 * total["prefill_run_s"] / max(1.0, total["prefilled_tokens"]), 3),
        "prompt_share_from_cache": round(1 - total["prefilled_tokens"] / max(1.0, total["prompt_tokens"]), 4),
        "prefix_block_hit_rate": round(total["prefix_block_hits"] / max(1.0, total["prefix_block_queries"]), 4),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def turn_summary(turns: Sequence[Turn]) -> dict[str, Any]:
    """TTFT p50/p90 overall and per turn, prompt and cached tokens, errors."""
    ok = [t for t in turns if not t.streamed.broken]
    per_turn: dict[int, list[float]] = {}
    for t in ok:
        per_turn.setdefault(t.turn, []).append(t.streamed.ttft)
    usage = [t.streamed.usage or {} for t in ok]
    prompt = sum(int(u.get("prompt_tokens") or 0) for u in usage)
    cached = sum(int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for u in usage)
    nodes: dict[str, int] = {}
    for t in ok:
        nodes[t.streamed.node] = nodes.get(t.streamed.node, 0) + 1
    where = {(t.conversation, t.turn): t.streamed.node for t in ok}
    moved: dict[int, int] = {}
    for (c, k), node in where.items():
        if k > 0 and where.get((c, k - 1), node) != node:
            moved[k] = moved.get(k, 0) + 1
    return {
        "ttft_p50_s": percentile([t.streamed.ttft for t in ok], 0.5),
        "ttft_p90_s": percentile([t.streamed.ttft for t in ok], 0.9),
        "ttft_p50_by_turn_s": {str(k + 1): round(percentile(v, 0.5), 4) for k, v in sorted(per_turn.items())},
        "prompt_tokens": prompt,
        "cached_prompt_share": cached / prompt if prompt else 0.0,
        "first_prompt_tokens": int((usage[0] if usage else {}).get("prompt_tokens") or 0),
        "streams_per_node": dict(sorted(nodes.items())),
        "turns_on_another_node": sum(moved.values()),
        "turns_on_another_node_by_turn": {str(k + 1): moved.get(k, 0) for k in sorted(per_turn) if k > 0},
        "errors": [t.streamed.error or "no finish reason" for t in turns if t.streamed.broken],
    }


# -- the fleet's side ----------------------------------------------------------------------


def central_text_stats(fleet: Fleet) -> dict[str, Any]:
    """Central's text gateway counters (``GET /api/v1/gateway``'s ``text``)."""
    r = fleet.client.get(f"{central_url(fleet)}/api/v1/gateway")
    r.raise_for_status()
    text: dict[str, Any] = r.json().get("text", {})
    return text


def central_url(fleet: Fleet) -> str:
    """Central's HTTP base URL."""
    assert fleet.central is not None
    return fleet.central.http_url


def wait_routed(fleet: Fleet, model: str, nodes: set[str], timeout_s: float) -> None:
    """Send one-token requests through central (short prompts: no prefix, so equal loads take
    turns) until each of ``nodes`` answered one: central routes to all of them again."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    salt = 0
    while not nodes <= seen:
        if time.monotonic() > deadline:
            raise fleet.fail(f"central did not route {model} to {sorted(nodes - seen)} within {timeout_s}s")
        salt += 1
        body = greedy(model, 1, prompt=f"probe {salt}")
        r = fleet.client.post(f"{central_url(fleet)}/v1/completions", json=body, timeout=60)
        if r.status_code == 200:
            seen.add(r.headers.get(NODE_HEADER, ""))
        else:
            time.sleep(0.2)


# -- streams that lose their node ----------------------------------------------------------


@dataclass
class KillRound:
    """Streams through central while one of the nodes serving them was SIGKILLed."""

    victim: str
    streams: list[Streamed]
    on_victim: int
    """Streams that had started on the victim and had not finished when it died."""
    resumed: int
    """Streams central continued on another node during the round."""


async def kill_round(fleet: Fleet, bodies: Sequence[dict[str, Any]], after_tokens: int, turn: int) -> KillRound:
    """Start every body as a stream through central; once the first has ``after_tokens``
    tokens, SIGKILL the node most of the unfinished ones that already delivered tokens started
    on (ties: by ``turn``); wait for all. Not once each has them: the last stream's first token
    may come after the others ended (a small model, a loaded machine), and the kill would then
    hit no stream. A stream without a token yet is not counted: central retries it before its
    first token, which is not the mid-stream case measured here."""
    url = f"{central_url(fleet)}/v1/completions"
    resumed_before = central_text_stats(fleet).get("resumed", 0)
    outs = [Streamed(0.0) for _ in bodies]
    events = [asyncio.Event() for _ in bodies]
    timeout = httpx.Timeout(30.0, read=120.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64)) as client:
        tasks = [asyncio.create_task(stream(client, url, b, o, e, after_tokens))
                 for b, o, e in zip(bodies, outs, events, strict=True)]  # fmt: skip
        waits = [asyncio.create_task(e.wait()) for e in events]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        nodes = sorted(n for n, p in fleet.edges.items() if p.alive())
        counts = dict.fromkeys(nodes, 0)
        for out in outs:
            if out.finish_reason is None and out.error is None and out.token_ids and out.node in counts:
                counts[out.node] += 1
        victim = max(nodes, key=lambda n: (counts[n], -((nodes.index(n) - turn) % len(nodes))))
        fleet.edges[victim].kill()
        streams = list(await asyncio.gather(*tasks))
    resumed = central_text_stats(fleet).get("resumed", 0) - resumed_before
    return KillRound(victim, streams, counts[victim], resumed)


async def references(url: str, bodies: Sequence[dict[str, Any]]) -> list[Streamed]:
    """Each body streamed alone, one after another, from one node: the undisturbed runs."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=120.0)) as client:
        return [await stream(client, f"{url}/v1/completions", b) for b in bodies]


# -- many clients --------------------------------------------------------------------------


async def many_streams(urls: Sequence[str], bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stream ``bodies[i]`` to ``urls[i % len(urls)]`` all at once: tokens, wall time, rate, errors."""
    limits = httpx.Limits(max_connections=4 * len(bodies))
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=300.0), limits=limits) as client:
        streams = await asyncio.gather(
            *(stream(client, f"{urls[i % len(urls)]}/v1/completions", b) for i, b in enumerate(bodies))
        )
    ok = [s for s in streams if not s.broken]
    tokens = sum(len(s.token_ids) for s in ok)
    wall = max((s.end for s in ok), default=0.0) - min((s.start for s in ok), default=0.0)
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_s": tokens / wall if wall > 0 else 0.0,
            "errors": [s.error or "no finish reason" for s in streams if s.broken]}  # fmt: skip
