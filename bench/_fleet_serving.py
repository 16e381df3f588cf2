"""The serving sections of ``bench.generate_fleet``: prefix-aware routing against
least-outstanding on a multi-turn chat workload (``affinity``), streams whose edge is
SIGKILLed mid-way (``midstream``), and what central's gateway costs (``gateway``). Each runs
``--serve-edges`` edges serving ``--serve-shape``'s random Llama as the 4-bit artifact."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._chatload import (
    ChatPlan,
    Conversations,
    central_text_stats,
    central_url,
    chat_client,
    counters_delta,
    engine_breakdown,
    engine_counters,
    greedy,
    kill_round,
    many_streams,
    references,
    turn_summary,
    wait_routed,
)
from bench._fleet import Fleet
from bench._llmfleet import MODEL, llm_fleet
from bench._textload import prompt_ids
from bench.generate import build_models
from modelfleet.zoo.llm import SHAPES

__all__ = ["affinity_figures", "gateway_figures", "midstream_figures"]


def serving_folder(args: argparse.Namespace) -> Path:
    """``--serve-shape``'s random Llama as central's 4-bit artifact (``int4-b32``, as
    ``bench.generate`` builds it), written once into ``args.model_cache``."""
    s = SHAPES[args.serve_shape]
    folder: Path = args.model_cache / f"llm-int4-h{s.hidden}-l{s.layers}-i{s.intermediate}"
    if not folder.is_dir():
        args.model_cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=args.model_cache))
        try:
            _, int4 = build_models(tmp, args.serve_shape)
            os.replace(int4, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextlib.contextmanager
def serving_fleet(args: argparse.Namespace, central_env: dict[str, str] | None = None) -> Iterator[Fleet]:
    """``--serve-edges`` edges serving the 4-bit model (pushed as is), each engine with its share
    of the cores and no spinning threads (the edges share the machine), central routing to all."""
    threads = max(1, len(os.sched_getaffinity(0)) // args.serve_edges)
    edge_env = [f"MODELFLEET_GENERATION__INTRA_OP_THREADS={threads}", "MODELFLEET_GENERATION__SPINNING=false"]
    # a wave of long prompts queues for minutes on a small machine: a silent node is not a dead one
    text_timeout = {"MODELFLEET_GATEWAY__TEXT_READ_TIMEOUT_S": "600"}
    central = [f"{k}={v}" for k, v in {**text_timeout, **(central_env or {})}.items()]
    fleet_args = argparse.Namespace(**{**vars(args), "edge_env": [*edge_env, *args.edge_env],
                                       "central_env": [*central, *args.central_env]})  # fmt: skip
    folder = serving_folder(args)
    with llm_fleet(fleet_args, args.serve_edges) as fleet:
        fleet.push_folder(MODEL, "1", folder)
        fleet.wait_complete(MODEL, "1", timeout_s=args.timeout_s)
        for node in fleet.edges:
            fleet.wait_model_ready(node, MODEL, timeout_s=args.timeout_s)
        wait_routed(fleet, MODEL, set(fleet.edges), args.timeout_s)  # also each engine's first run
        yield fleet


#: The routing policies the affinity section compares: the baseline first.
POLICIES = ("least_outstanding", "prefix")


def fleet_counters(fleet: Fleet) -> dict[str, dict[str, float]]:
    """Each edge's ``engine_counters`` now."""
    return {n: engine_counters(fleet.edge_metrics(n)) for n in fleet.edges}


#: Each edge's ``engine_counters``, read after each wave (the first before any).
Readings = list[dict[str, dict[str, float]]]


async def interleaved_waves(fleets: dict[str, Fleet], plan: ChatPlan) -> dict[str, tuple[Conversations, Readings]]:
    """The same conversations through each fleet's central, wave by wave in turn (the fleets
    never run at once; which goes first alternates), so that both policies see the machine's
    load of the same minutes; the edges' counters read after every wave."""
    chats = {p: Conversations(plan, MODEL) for p in fleets}
    readings = {p: [fleet_counters(f)] for p, f in fleets.items()}
    async with chat_client(plan) as client:
        for t in range(plan.turns):
            for p in list(fleets) if t % 2 == 0 else list(fleets)[::-1]:
                await chats[p].wave(client, central_url(fleets[p]))
                readings[p].append(fleet_counters(fleets[p]))
    return {p: (chats[p], readings[p]) for p in fleets}


def policy_figures(chat: Conversations, readings: Readings, fleet: Fleet) -> dict[str, Any]:
    """One policy's TTFTs, placement and, per wave, where the edges' time to first token went."""
    first, last = readings[0], readings[-1]
    generated = {n: int(last[n]["generated_tokens"] - first[n]["generated_tokens"]) for n in first}
    by_turn = {
        str(t + 1): engine_breakdown({n: counters_delta(after[n], before[n]) for n in before})
        for t, (before, after) in enumerate(itertools.pairwise(readings))
    }
    return {
        **turn_summary(chat.turns),
        "generated_per_node": generated,
        "routed": central_text_stats(fleet).get("routed", {}),
        "wall_s": round(chat.wall_s, 1),
        "edge": engine_breakdown({n: counters_delta(last[n], first[n]) for n in first}),
        "edge_by_turn": by_turn,
    }


def affinity_figures(args: argparse.Namespace) -> dict[str, Any]:
    """A multi-turn chat workload through a fleet routing by least outstanding and one routing
    by prefix, both up at once, their waves taking turns."""
    plan = ChatPlan(args.conversations, args.turns, args.system_tokens, args.user_tokens, args.reply_tokens)
    with contextlib.ExitStack() as stack:
        fleets = {p: stack.enter_context(serving_fleet(args, {"MODELFLEET_GATEWAY__TEXT_ROUTING": p}))
                  for p in POLICIES}  # fmt: skip
        done = asyncio.run(interleaved_waves(fleets, plan))
        runs = {p: policy_figures(done[p][0], done[p][1], fleets[p]) for p in POLICIES}
    prefix, least = runs["prefix"], runs["least_outstanding"]
    per_node = list(prefix["generated_per_node"].values())
    mean = sum(per_node) / len(per_node)
    return {
        "affinity_ttft_ratio": prefix["ttft_p50_s"] / least["ttft_p50_s"] if least["ttft_p50_s"] else None,
        "load_max_over_mean": max(per_node) / mean if mean else None,
        "plan": vars(plan),
        "errors": len(prefix["errors"]) + len(least["errors"]),
        **runs,
    }


def midstream_figures(args: argparse.Namespace) -> dict[str, Any]:
    """``--kills`` times: ``--kill-streams`` greedy streams through central, the node most of
    them run on SIGKILLed once each has ``--kill-after`` tokens, then started again; every
    stream against the same prompt streamed undisturbed from one node."""
    bodies = [greedy(MODEL, args.stream_tokens, prompt=prompt_ids(args.prompt, 9000 + i))
              for i in range(2 * args.kill_streams)]  # fmt: skip
    rounds: list[dict[str, Any]] = []
    kills = broken = mismatches = 0
    with serving_fleet(args) as fleet:
        refs = asyncio.run(references(fleet.edges[sorted(fleet.edges)[0]].http_url, bodies))
        while kills < args.kills and len(rounds) < 3 * args.kills:
            chosen = [(len(rounds) * args.kill_streams + j) % len(bodies) for j in range(args.kill_streams)]
            r = asyncio.run(kill_round(fleet, [bodies[i] for i in chosen], args.kill_after, len(rounds)))
            wrong = [i for i, s in zip(chosen, r.streams, strict=True)
                     if s.token_ids != refs[i].token_ids or s.text != refs[i].text]  # fmt: skip
            # a kill counts once it hit a stream mid-way: central went on with one elsewhere, or
            # one broke (a stream on the victim may still end before the SIGKILL lands)
            hit = [s for s in r.streams if s.broken and s.node == r.victim]
            kills += r.on_victim > 0 and (r.resumed > 0 or bool(hit))
            broken += sum(s.broken for s in r.streams)
            mismatches += len(wrong)
            rounds.append({"victim": r.victim, "streams_on_victim": r.on_victim, "resumed": r.resumed,
                           "broken": [s.error or "no finish reason" for s in r.streams if s.broken],
                           "mismatched_prompts": wrong})  # fmt: skip
            fleet.start_edge(r.victim)
            fleet.wait_model_ready(r.victim, MODEL, timeout_s=args.timeout_s)
            wait_routed(fleet, MODEL, {r.victim}, args.timeout_s)
        resumed = central_text_stats(fleet).get("resumed", 0)
    return {
        "midstream_kills": kills,
        "broken_streams": broken,
        "token_mismatches": mismatches,
        "rounds": len(rounds),
        "streams": len(rounds) * args.kill_streams,
        "resumed": resumed,
        "reference_broken": sum(s.broken for s in refs),
        "per_round": rounds,
    }


def gateway_figures(args: argparse.Namespace) -> dict[str, Any]:
    """``--clients`` greedy streams at once, straight to the edges (round robin) and through
    central, alternated (direct, central, central, direct) so drift cancels."""
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "central": []}
    with serving_fleet(args) as fleet:
        edges = [fleet.edges[n].http_url for n in sorted(fleet.edges)]
        for i, mode in enumerate(("direct", "central", "central", "direct")):
            bodies = [greedy(MODEL, args.gateway_tokens, prompt=prompt_ids(args.prompt, 20000 + 100 * i + c))
                      for c in range(args.clients)]  # fmt: skip
            urls = edges if mode == "direct" else [central_url(fleet)]
            runs[mode].append(asyncio.run(many_streams(urls, bodies)))

    def rate(mode: str) -> float:
        return sum(r["tokens"] for r in runs[mode]) / sum(r["wall_s"] for r in runs[mode])

    return {
        "gateway_ratio": rate("central") / rate("direct"),
        "central_tokens_s": rate("central"),
        "direct_tokens_s": rate("direct"),
        "clients": args.clients,
        "tokens_per_stream": args.gateway_tokens,
        "errors": sum(len(r["errors"]) for rs in runs.values() for r in rs),
        "runs": runs,
    }
