"""Benchmark: language models across a fleet (issue 27), in sections, one JSON with the CPU flags.

Every section runs its own fleet of real processes on loopback (``llm_fleet``: Mosquitto, central
with quantization off, so the folders are served as pushed, and edges); ``--sections`` picks them
(default: all). The model is the zoo's random-weight Llama (``modelfleet.zoo.llm``, ``--shape``,
``500m`` by default: 2.07 GB in FP32, 16 layers) as the GenAI folder a push of a language model
takes: graph, ``model.onnx.data`` (tensors aligned at 4 KiB) and the tokenizer and config.

* ``distribution``: ``--edges`` edges. The folder is pushed with ``activate=false`` and rolled out
  staged (``stage: true``, never flipped): every edge fetches, verifies and assembles it but
  does not load it (eight 2 GB ONNX Runtime sessions would not fit a small machine).
  ``llm_origin_ratio``: central's ``origin.bytes_sent`` over the folder's bytes once every edge
  reports it staged (target <= 1.10: each chunk leaves central about once, placement and peers
  do the rest); every file on every edge is checked byte for byte against the pushed one.
* ``finetune``: ``--finetune-edges`` edges. A tiny version ``0`` is served (what the others are
  staged beside, and rolled back to), ``1`` is staged, rolled back, then ``2``, the same model
  with layers ``--changed`` redrawn (``write_random_llm(layer_seeds=…)``), is staged.
  ``finetune_delta_ratio``: the most bytes one edge fetched (``fetch.bytes_from_origin`` +
  ``bytes_from_peers``) for ``2``, over the folder's bytes (target <= 0.2); with the mean, the
  share of ``2``'s bytes in chunks ``1`` lacks (content-defined, central's manifests) beside
  fixed 1 MiB blocks', and the changed tensors' own share (the floor).

Each section writes its figures under its name and its headline keys at the top level. Another
section (the gateway's figures) adds a function taking the parsed arguments to ``SECTIONS``.

Usage: ``python -m bench.generate_fleet --json out.json [--sections distribution,finetune]
[--shape 500m] [--edges 8] [--finetune-edges 3] [--chunk-avg-kb 1024]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from bench._chatload import (
    ChatPlan,
    central_text_stats,
    central_url,
    chat_waves,
    generated_tokens,
    greedy,
    kill_round,
    many_streams,
    references,
    turn_summary,
    wait_routed,
)
from bench._fleet import Fleet, chunking_env, parse_env_pairs, sigterm_raises, write_result
from bench._rollout_api import central_call, fetch_counters, settled_counters, wait_rollout
from bench._textload import prompt_ids
from bench.delta import new_bytes_ratio
from bench.generate import build_models
from bench.report import machine
from bench.zoo import cpu_flags
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker
from modelfleet.zoo.llm import SHAPES, DecoderShape, write_random_llm

TARGETS = {
    "llm_origin_ratio": 1.10, "finetune_delta_ratio": 0.2, "affinity_ttft_ratio": 0.5, "load_max_over_mean": 1.25,
    "midstream_kills": 20, "broken_streams": 0, "token_mismatches": 0, "gateway_ratio": 0.9,
}  # fmt: skip
#: Figures that must stay at or below their target (the others at or above).
AT_MOST = {"llm_origin_ratio", "finetune_delta_ratio", "affinity_ttft_ratio", "load_max_over_mean", "broken_streams",
           "token_mismatches"}  # fmt: skip
MODEL = "llm"
FIXED_BLOCK = 1024 * 1024


# -- models --------------------------------------------------------------------------------


def bench_shape(args: argparse.Namespace) -> DecoderShape:
    """``--shape``, with ``--layers`` when given."""
    shape = SHAPES[args.shape]
    return replace(shape, layers=args.layers) if args.layers else shape


def llm_folder(args: argparse.Namespace, seed: int = 0, changed: tuple[int, ...] = (), shape: str = "") -> Path:
    """The random Llama's GenAI folder (``changed`` layers drawn from seed + 1), written once
    into ``args.model_cache`` and reused by every section of the run."""
    s = SHAPES[shape] if shape else bench_shape(args)
    tag = f"-c{'.'.join(map(str, changed))}" if changed else ""
    name = f"llm-h{s.hidden}-l{s.layers}-i{s.intermediate}-s{seed}{tag}"
    folder: Path = args.model_cache / name
    if not folder.is_dir():
        args.model_cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=args.model_cache))
        try:
            write_random_llm(tmp, s, seed=seed, layer_seeds={i: seed + 1 for i in changed})
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def folder_bytes(folder: Path) -> int:
    """Bytes of every file of a folder: the graph, its data and the companions."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(FIXED_BLOCK):
            h.update(block)
    return h.hexdigest()


def layer_bytes(folder: Path, layers: tuple[int, ...]) -> int:
    """Bytes of ``model.onnx.data`` holding the tensors of ``layers`` (from the graph's offsets)."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    prefixes = tuple(f"model.layers.{i}." for i in layers)
    total = 0
    for t in graph.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if t.name.startswith(prefixes) and "length" in info:
            total += int(info["length"])
    return total


def fixed_blocks(folder: Path) -> list[tuple[str, int]]:
    """(sha256, length) of every file's consecutive 1 MiB blocks, files in name order."""
    out = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        with path.open("rb") as f:
            while block := f.read(FIXED_BLOCK):
                out.append((hashlib.sha256(block).hexdigest(), len(block)))
    return out


def manifest_chunks(manifest: dict[str, Any]) -> list[tuple[str, int]]:
    """(digest, size) of the served artifact's chunks: the graph's, then each file's."""
    chunks = [*manifest["chunks"], *(c for f in manifest.get("files", []) for c in f["chunks"])]
    return [(c["digest"], int(c["size"])) for c in chunks]


# -- the fleet -----------------------------------------------------------------------------


#: Heartbeats (MQTT) carry each node's progress on a rollout; often, so the waits end soon.
HEARTBEAT_S = 0.5


@contextlib.contextmanager
def llm_fleet(args: argparse.Namespace, edges: int) -> Iterator[Fleet]:
    """A Mosquitto broker, central (quantization off: folders are served as pushed; the chunking
    bounds; ``--central-env``) and ``edges`` edges (``--edge-env``), all registered; stopped after."""
    with MosquittoBroker(log=BENCH_LOG) as broker:
        broker_env = {"MODELFLEET_BROKER__HOST": broker.host, "MODELFLEET_BROKER__PORT": str(broker.port)}
        central_env = {
            "MODELFLEET_QUANTIZE__ENABLED": "false",
            "MODELFLEET_MQTT__ENABLED": "true",
            "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": str(HEARTBEAT_S),
            "MODELFLEET_ROLLOUT__INTERVAL_S": "0.2",
            **broker_env,
            **chunking_env(args.chunk_avg_kb),
            **parse_env_pairs(args.central_env),
        }
        edge_env = {
            "MODELFLEET_HEARTBEAT__ENABLED": "true",
            "MODELFLEET_HEARTBEAT__INTERVAL_S": str(HEARTBEAT_S),
            **broker_env,
            **parse_env_pairs(args.edge_env),
        }
        with Fleet(root=args.work_dir, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
            fleet.start(edges)
            yield fleet


def stage(fleet: Fleet, version: str, timeout_s: float) -> dict[str, Any]:
    """A staged rollout of ``version`` to every node; returns once each reports it staged."""
    r = central_call(fleet, "POST", f"/api/v1/models/{MODEL}/rollouts", json={"version": version, "stage": True})
    if r.status_code != 201:
        raise fleet.fail(f"staged rollout of {version} refused: {r.status_code} {r.text[:300]}", [])
    targets = set(r.json()["targets"])

    def staged(doc: dict[str, Any]) -> bool:
        states = doc["nodes"]
        if any(states.get(n) in ("failed", "refused") for n in targets):
            raise fleet.fail(f"{MODEL}:{version} failed on a node: {states} {doc.get('failures')}")
        return doc["version"] == version and all(states.get(n) == "staged" for n in targets)

    return wait_rollout(fleet, MODEL, f"{version} staged on every node", staged, timeout_s)


def verify_staged(fleet: Fleet, version: str, folder: Path) -> dict[str, bool]:
    """node → whether every file of ``folder`` lies on it, byte for byte, beside the graph."""
    want = {p.name: sha256_of(p) for p in folder.iterdir() if p.is_file()}
    out = {}
    for node in fleet.edges:
        directory = fleet.model_file(node, MODEL, version).parent
        out[node] = all((directory / n).is_file() and sha256_of(directory / n) == d for n, d in want.items())
    return out


def fetched(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """node → chunk bytes it fetched (origin + peers) between two ``fetch_counters`` readings."""

    def total(c: dict[str, int]) -> int:
        return c["bytes_from_origin"] + c["bytes_from_peers"]

    return {node: total(after[node]) - total(before.get(node, {"bytes_from_origin": 0, "bytes_from_peers": 0}))
            for node in after}  # fmt: skip


# -- sections ------------------------------------------------------------------------------


def distribution_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The model staged on ``--edges`` edges: what central sent, per edge where it came from."""
    folder = llm_folder(args)
    size = folder_bytes(folder)
    with llm_fleet(args, args.edges) as fleet:
        pushed = fleet.push_folder(MODEL, "1", folder, activate=False)
        origin_before = fleet.stats()["origin"]
        started = time.time()
        stage(fleet, "1", args.timeout_s)
        staged_s = time.time() - started
        origin = fleet.stats()["origin"]
        counters = fetch_counters(fleet)
        verified = verify_staged(fleet, "1", folder)
    sent = origin["bytes_sent"] - origin_before["bytes_sent"]
    return {
        "llm_origin_ratio": sent / size,
        "edges": args.edges,
        "model_bytes": size,
        "chunks": len(manifest_chunks(pushed.manifest)),
        "kind": pushed.manifest.get("kind"),
        "files": sorted(f["path"] for f in pushed.manifest.get("files", [])),
        "push_s": pushed.acked_at - pushed.started_at,
        "staged_s": staged_s,
        "origin_bytes": sent,
        "origin_chunks_sent": origin["chunks_sent"] - origin_before["chunks_sent"],
        "per_edge": {n: {**c, "files_verified": verified[n]} for n, c in counters.items()},
        "all_files_verified": all(verified.values()),
    }


def finetune_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Version 2 (``--changed`` layers redrawn) staged where version 1 was: bytes each edge fetched."""
    changed = tuple(args.changed)
    v0, v1 = llm_folder(args, shape="tiny"), llm_folder(args)
    v2 = llm_folder(args, changed=changed)
    size = folder_bytes(v2)
    with llm_fleet(args, args.finetune_edges) as fleet:
        fleet.push_folder(MODEL, "0", v0)  # served, cheap to load: what 1 is rolled back to
        fleet.wait_complete(MODEL, "0", timeout_s=args.timeout_s)
        p1 = fleet.push_folder(MODEL, "1", v1, activate=False)
        origin_before = fleet.stats()["origin"]["bytes_sent"]
        stage(fleet, "1", args.timeout_s)
        v1_origin = fleet.stats()["origin"]["bytes_sent"] - origin_before
        # a staged rollout ends only at its flip or a rollback; the edges keep 1's chunks cached
        r = central_call(fleet, "POST", f"/api/v1/models/{MODEL}/rollback")
        if r.status_code != 200:
            raise fleet.fail(f"rollback of 1 refused: {r.status_code} {r.text[:300]}", [])
        p2 = fleet.push_folder(MODEL, "2", v2, activate=False)
        before = settled_counters(fleet)
        started = time.time()
        stage(fleet, "2", args.timeout_s)
        staged_s = time.time() - started
        after = settled_counters(fleet)
        verified = verify_staged(fleet, "2", v2)
    per_edge = fetched(before, after)
    ratios = [b / size for b in per_edge.values()]
    return {
        "finetune_delta_ratio": max(ratios),
        "finetune_delta_ratio_mean": sum(ratios) / len(ratios),
        "edges": args.finetune_edges,
        "model_bytes": size,
        "changed_layers": list(changed),
        "layers": bench_shape(args).layers,
        "changed_tensor_ratio": layer_bytes(v2, changed) / size,
        "cdc_new_bytes_ratio": new_bytes_ratio(manifest_chunks(p1.manifest), manifest_chunks(p2.manifest)),
        "fixed_block_new_bytes_ratio": new_bytes_ratio(fixed_blocks(v1), fixed_blocks(v2)),
        # a little under 1: the tokenizer's chunks came with 0
        "v1_origin_ratio": v1_origin / folder_bytes(v1),
        "v2_staged_s": staged_s,
        "per_edge_bytes": per_edge,
        "all_files_verified": all(verified.values()),
    }


# -- serving sections: routing, streams that lose their node, the gateway's cost ------------


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
    central = [f"{k}={v}" for k, v in (central_env or {}).items()]
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


def chat_run(args: argparse.Namespace, plan: ChatPlan, policy: str) -> dict[str, Any]:
    """The chat workload through central routing by ``policy``, on a fleet of its own."""
    with serving_fleet(args, {"MODELFLEET_GATEWAY__TEXT_ROUTING": policy}) as fleet:
        before = {n: generated_tokens(fleet.edge_metrics(n)) for n in fleet.edges}
        started = time.monotonic()
        turns = asyncio.run(chat_waves(central_url(fleet), MODEL, plan))
        wall = time.monotonic() - started
        generated = {n: generated_tokens(fleet.edge_metrics(n)) - before[n] for n in fleet.edges}
        routed = central_text_stats(fleet).get("routed", {})
    return {**turn_summary(turns), "generated_per_node": generated, "routed": routed, "wall_s": round(wall, 1)}


def affinity_figures(args: argparse.Namespace) -> dict[str, Any]:
    """A multi-turn chat workload with least-outstanding routing, then prefix-aware routing."""
    plan = ChatPlan(args.conversations, args.turns, args.system_tokens, args.user_tokens, args.reply_tokens)
    runs = {policy: chat_run(args, plan, policy) for policy in ("least_outstanding", "prefix")}
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
            kills += r.on_victim > 0
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


#: Section name → its function; each returns its figures, headline keys (``TARGETS``) included.
SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "distribution": distribution_figures,
    "finetune": finetune_figures,
    "affinity": affinity_figures,
    "midstream": midstream_figures,
    "gateway": gateway_figures,
}


# -- the run -------------------------------------------------------------------------------


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def met(result: dict[str, Any]) -> dict[str, bool]:
    """Each measured headline key against its target."""
    return {
        key: (result[key] <= target if key in AT_MOST else result[key] >= target)
        for key, target in TARGETS.items()
        if result.get(key) is not None
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every chosen section, in order; the models are written once, removed after unless cached."""
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    owned_cache = args.model_cache is None
    if owned_cache:
        args.model_cache = Path(tempfile.mkdtemp(prefix="bench-generate-fleet-", dir=args.work_dir))
    # the machine may be shared: its load beside the figures says how much the timings are worth
    result: dict[str, Any] = {"bench": "generate_fleet", "sections": list(args.sections), "load_avg_start": _load()}
    try:
        for name in args.sections:
            print(f"section {name} ...", flush=True)
            started = time.monotonic()
            figures = SECTIONS[name](args)
            figures["section_s"] = round(time.monotonic() - started, 1)
            result[name] = figures
            result |= {k: v for k, v in figures.items() if k in TARGETS}
    finally:
        if owned_cache:
            shutil.rmtree(args.model_cache, ignore_errors=True)
    return {
        **result,
        "targets": {k: v for k, v in TARGETS.items() if k in result},
        "met": met(result),
        "errors": 0,
        "shape": args.shape,
        "layers": bench_shape(args).layers,
        "chunk_avg_kb": args.chunk_avg_kb,
        "load_avg_end": _load(),
        "cpu_flags": cpu_flags(),
        "machine": machine(),
        "cores": len(os.sched_getaffinity(0)),
    }


def print_table(result: dict[str, Any]) -> None:
    """Each measured key against its target, then the CPU."""
    for key, target in result["targets"].items():
        word = "<=" if key in AT_MOST else ">="
        print(f"{key:<22} {result[key]:>10.4f}  (target {word} {target}) {'met' if result['met'][key] else 'MISSED'}")
    if "distribution" in result:
        d = result["distribution"]
        print(f"distribution: {d['model_bytes'] / 1e9:.3f} GB to {d['edges']} edges, staged in {d['staged_s']:.1f}s, "
              f"central sent {d['origin_bytes'] / 1e9:.3f} GB, files verified {d['all_files_verified']}")  # fmt: skip
    if "finetune" in result:
        f = result["finetune"]
        print(f"finetune: layers {f['changed_layers']} of {f['layers']} changed ({f['changed_tensor_ratio']:.4f} of "
              f"the bytes); per edge mean {f['finetune_delta_ratio_mean']:.4f}; new bytes CDC "
              f"{f['cdc_new_bytes_ratio']:.4f}, fixed 1 MiB {f['fixed_block_new_bytes_ratio']:.4f}")  # fmt: skip
    print(f"cpu flags: {' '.join(result['cpu_flags'])}; {result['machine']}")


def _sections(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"sections are {', '.join(SECTIONS)}; got {value!r}")
    return names


def _layers(value: str) -> list[int]:
    try:
        return sorted({int(v) for v in value.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer indexes like 3,9; got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.generate_fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--sections", type=_sections, default=list(SECTIONS), help=f"of {','.join(SECTIONS)} (all)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="500m", help="the zoo's random Llama shape")
    p.add_argument("--layers", type=int, default=0, help="layers instead of the shape's (0: the shape's)")
    p.add_argument("--edges", type=int, default=8, help="edges of the distribution section")
    p.add_argument("--finetune-edges", type=int, default=3, help="edges of the finetune section")
    p.add_argument("--changed", type=_layers, default=[3, 9], help="layers the fine-tune redraws")
    p.add_argument("--serve-shape", choices=sorted(SHAPES), default="200m", help="shape served (as int4) by the "
                   "affinity, midstream and gateway sections")
    p.add_argument("--serve-edges", type=int, default=3, help="edges of the serving sections")
    p.add_argument("--conversations", type=int, default=24, help="affinity: conversations")
    p.add_argument("--turns", type=int, default=4, help="affinity: turns per conversation")
    p.add_argument("--system-tokens", type=int, default=1000, help="affinity: tokens of the shared system prompt")
    p.add_argument("--user-tokens", type=int, default=150, help="affinity: tokens of each user message")
    p.add_argument("--reply-tokens", type=int, default=48, help="affinity: tokens of each reply")
    p.add_argument("--kills", type=int, default=20, help="midstream: SIGKILLs of an edge with streams on it")
    p.add_argument("--kill-streams", type=int, default=4, help="midstream: streams running at each kill")
    p.add_argument("--kill-after", type=int, default=8, help="midstream: tokens each stream has when the edge dies")
    p.add_argument("--stream-tokens", type=int, default=64, help="midstream: tokens per stream")
    p.add_argument("--clients", type=int, default=16, help="gateway: concurrent streaming clients")
    p.add_argument("--gateway-tokens", type=int, default=64, help="gateway: tokens per stream")
    p.add_argument("--prompt", type=int, default=32, help="midstream, gateway: prompt tokens per stream")
    p.add_argument("--chunk-avg-kb", type=int, default=1024, help="average chunk size in KiB (min avg/4, max avg×4)")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for every edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="timeout of each wait for the edges")
    p.add_argument("--work-dir", type=Path, default=None, help="where fleets and models go (default: system temp)")
    p.add_argument("--model-cache", type=Path, default=None, help="keep the written models here (default: removed)")
    p.add_argument("--keep", action="store_true", help="keep the fleets' data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run the sections, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    layers = bench_shape(args).layers
    if args.edges < 1 or args.finetune_edges < 1 or any(not 0 <= i < layers for i in args.changed):
        print(f"--edges and --finetune-edges must be positive, --changed within the {layers} layers")
        return 2
    with sigterm_raises():
        result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
