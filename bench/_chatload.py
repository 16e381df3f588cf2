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
_GENERATED = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.M)


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


async def chat_waves(url: str, model: str, plan: ChatPlan) -> list[Turn]:
    """Every conversation's turn ``t`` at once (a wave) to ``url``'s chat completions, the next
    wave when all have answered; each turn's messages are the conversation so far (the replies
    as the client got them)."""
    limits = httpx.Limits(max_connections=4 * plan.conversations)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0), limits=limits) as client:
        return await _waves(client, f"{url}/v1/chat/completions", model, plan)


async def _waves(client: httpx.AsyncClient, url: str, model: str, plan: ChatPlan) -> list[Turn]:
    system, users = plan.system(), plan.users()
    history = [[{"role": "system", "content": system}] for _ in range(plan.conversations)]
    turns: list[Turn] = []
    for t in range(plan.turns):
        for c, messages in enumerate(history):
            messages.append({"role": "user", "content": users[c][t]})
        bodies = [greedy(model, plan.reply_tokens, messages=list(m)) for m in history]
        answered = await asyncio.gather(*(stream(client, url, b) for b in bodies))
        for c, s in enumerate(answered):
            history[c].append({"role": "assistant", "content": s.text})
            turns.append(Turn(c, t, s))
    return turns


def generated_tokens(metrics: str) -> int:
    """``vllm:generation_tokens_total`` of an edge's ``/metrics`` (every model summed)."""
    return int(sum(float(v) for v in _GENERATED.findall(metrics)))


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
    return {
        "ttft_p50_s": percentile([t.streamed.ttft for t in ok], 0.5),
        "ttft_p90_s": percentile([t.streamed.ttft for t in ok], 0.9),
        "ttft_p50_by_turn_s": {str(k + 1): round(percentile(v, 0.5), 4) for k, v in sorted(per_turn.items())},
        "prompt_tokens": prompt,
        "cached_prompt_share": cached / prompt if prompt else 0.0,
        "first_prompt_tokens": int((usage[0] if usage else {}).get("prompt_tokens") or 0),
        "streams_per_node": dict(sorted(nodes.items())),
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
    """Start every body as a stream through central; once each has ``after_tokens`` tokens,
    SIGKILL the node most of the unfinished ones started on (ties: by ``turn``); wait for all."""
    url = f"{central_url(fleet)}/v1/completions"
    resumed_before = central_text_stats(fleet).get("resumed", 0)
    outs = [Streamed(0.0) for _ in bodies]
    events = [asyncio.Event() for _ in bodies]
    timeout = httpx.Timeout(30.0, read=120.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64)) as client:
        tasks = [asyncio.create_task(stream(client, url, b, o, e, after_tokens))
                 for b, o, e in zip(bodies, outs, events, strict=True)]  # fmt: skip
        await asyncio.gather(*(e.wait() for e in events))
        nodes = sorted(n for n, p in fleet.edges.items() if p.alive())
        counts = dict.fromkeys(nodes, 0)
        for out in outs:
            if out.finish_reason is None and out.error is None and out.node in counts:
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
