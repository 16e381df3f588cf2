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

The serving sections (``bench._fleet_serving``) run ``--serve-edges`` edges (3) serving
``--serve-shape``'s random Llama (``200m``) as the 4-bit artifact central's quantizer makes,
pushed as is; each engine gets its share of the cores, without spinning threads:

* ``affinity``: ``--conversations`` chats sharing one ``--system-tokens`` system prompt,
  ``--turns`` turns each of ``--user-tokens`` and ``--reply-tokens`` (greedy), every
  conversation's turn sent at once (a wave, in a seeded order that changes every turn) through
  central's ``/v1/chat/completions`` (streamed), the next wave when all answered. Two fleets
  are up at once (cold caches, same conversations), one with ``gateway.text_routing =
  "least_outstanding"``, one with ``"prefix"``; their waves take turns (never at once; which goes
  first alternates), so both see the machine's load of the same minutes. ``affinity_ttft_ratio``:
  TTFT p50 prefix / least-outstanding (target <= 0.5); ``load_max_over_mean``: tokens each edge
  generated under prefix routing (its ``vllm:generation_tokens_total``), the most over the mean
  (target <= 1.25). Per policy and per wave, where the edges' time to first token went (their
  queue and prefill histograms, seconds in prefill runs and decode steps, prompt tokens run and
  taken from the prefix cache) and how many turns ran on another node than the one before.
  The defaults (24 conversations, a 1,000-token system prompt, 7 turns of 70 user and 48 reply
  tokens: about 1,900 tokens at the last turn, within the served model's 2,048) make a chat
  whose own history outgrows each turn's new tokens, as a chat's does (users write ~70 tokens a
  turn on average in LMSYS-Chat-1M); docs/generation.md has the measured figures of both.
* ``midstream``: ``--kill-streams`` greedy streams through central; once the first has
  ``--kill-after`` tokens the edge most of them run on is SIGKILLed, then started again, until
  ``--kills`` kills have hit streams mid-way (``midstream_kills``). Every stream is compared token
  for token (and its text) with the same prompt streamed alone from one edge:
  ``broken_streams`` and ``token_mismatches`` (targets 0).
* ``gateway``: ``--clients`` greedy streams at once straight to the edges (round robin) and
  through central, alternated twice: ``gateway_ratio``, central's aggregate tokens/s over the
  edges' (target >= 0.9).

Each section writes its figures under its name and its headline keys at the top level; a new
section adds a function taking the parsed arguments to ``SECTIONS``.

Usage: ``python -m bench.generate_fleet --json out.json [--sections distribution,finetune,affinity,...]
[--shape 500m] [--edges 8] [--finetune-edges 3] [--chunk-avg-kb 1024] [--serve-shape 200m]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from bench._fleet import Fleet, sigterm_raises, write_result
from bench._fleet_serving import affinity_figures, gateway_figures, midstream_figures
from bench._llmfleet import MODEL, llm_fleet
from bench._rollout_api import central_call, fetch_counters, settled_counters, wait_rollout
from bench.delta import new_bytes_ratio
from bench.report import machine
from bench.zoo import cpu_flags
from modelfleet.zoo.llm import SHAPES, DecoderShape, write_random_llm

TARGETS = {
    "llm_origin_ratio": 1.10, "finetune_delta_ratio": 0.2, "affinity_ttft_ratio": 0.5, "load_max_over_mean": 1.25,
    "midstream_kills": 20, "broken_streams": 0, "token_mismatches": 0, "gateway_ratio": 0.9,
}  # fmt: skip
#: Figures that must stay at or below their target (the others at or above).
AT_MOST = {"llm_origin_ratio", "finetune_delta_ratio", "affinity_ttft_ratio", "load_max_over_mean", "broken_streams",
           "token_mismatches"}  # fmt: skip
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
        "errors": sum(
            f["errors"] for f in (result.get(n, {}) for n in args.sections) if isinstance(f.get("errors"), int)
        ),
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
    if "affinity" in result:
        a = result["affinity"]
        for policy in ("prefix", "least_outstanding"):
            r = a[policy]
            print(f"affinity {policy}: TTFT p50 {r['ttft_p50_s']:.3f}s p90 {r['ttft_p90_s']:.3f}s by turn "
                  f"{r['ttft_p50_by_turn_s']}, cached prompt share {r['cached_prompt_share']:.3f}, "
                  f"tokens per node {r['generated_per_node']}")  # fmt: skip
            e = r["edge"]
            print(f"  at the edges: queue {e['queue_mean_s']:.3f}s + admitted to first token "
                  f"{e['admitted_to_first_mean_s']:.3f}s a stream; {e['prefilled_tokens'] / max(1, e['streams']):.0f} "
                  f"prompt tokens run a stream ({e['prompt_share_from_cache']:.3f} from the prefix cache); "
                  f"prefill runs {e['prefill_run_s']:.1f}s, decode steps {e['decode_run_s']:.1f}s, turns warmed "
                  f"{e['warm_run_s']:.1f}s ({e['warmed_tokens']} tokens); "
                  f"{r['turns_on_another_node']} turns on another node than the one before")  # fmt: skip
    if "midstream" in result:
        m = result["midstream"]
        print(f"midstream: {m['rounds']} rounds, {m['streams']} streams, {m['resumed']} resumed by central")
    if "gateway" in result:
        g = result["gateway"]
        print(f"gateway: {g['clients']} clients, {g['central_tokens_s']:.1f} tokens/s through central, "
              f"{g['direct_tokens_s']:.1f} straight to the edges")  # fmt: skip
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
    p.add_argument(
        "--serve-shape",
        choices=sorted(SHAPES),
        default="200m",
        help="shape served (as int4) by the affinity, midstream and gateway sections",
    )
    p.add_argument("--serve-edges", type=int, default=3, help="edges of the serving sections")
    p.add_argument("--conversations", type=int, default=24, help="affinity: conversations")
    p.add_argument("--turns", type=int, default=7, help="affinity: turns per conversation")
    p.add_argument("--system-tokens", type=int, default=1000, help="affinity: tokens of the shared system prompt")
    p.add_argument("--user-tokens", type=int, default=70, help="affinity: tokens of each user message")
    p.add_argument("--reply-tokens", type=int, default=48, help="affinity: tokens of each reply")
    p.add_argument("--kills", type=int, default=20, help="midstream: SIGKILLs of an edge with streams on it")
    p.add_argument("--kill-streams", type=int, default=4, help="midstream: streams running at each kill")
    p.add_argument("--kill-after", type=int, default=8, help="midstream: tokens of the first stream at the kill")
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
    counts = (args.edges, args.finetune_edges, args.conversations, args.turns, args.kill_streams, args.clients)
    if min(counts) < 1 or args.serve_edges < 2 or any(not 0 <= i < layers for i in args.changed):
        print(f"edges, conversations, turns, streams and clients must be positive, --serve-edges at least 2 "
              f"(a stream needs a node to go on), --changed within the {layers} layers")  # fmt: skip
        return 2
    with sigterm_raises():
        result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
