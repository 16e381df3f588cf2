"""Delta benchmark: what an edge fetches when a new version changes one layer.

One central and one edge (real processes on loopback, no egress cap). v1 is a
generated float32 MLP of at least ``--model-mb`` MB; v2 is the same model with a
different ``head_seed``, so only the last layer's weights differ. The edge's
``fetch.bytes_fetched`` is read once v1 is complete and again once v2 is; the
difference over the model size is ``delta_ratio`` (target <= 0.15).

Baselines computed locally on the same files:

* ``fixed_chunk_delta_ratio``: the share of v2's bytes in fixed 1 MiB blocks whose
  hash is not among v1's blocks (what fixed-size chunking would refetch);
* ``shifted_*``: the same two ratios for a v1 copy whose ``doc_string`` was set,
  which moves every byte after the header: content-defined chunking still shares
  nearly everything, fixed blocks share nothing. (v2 changes values in place, so
  there fixed blocks do about as well; the shifted case shows what CDC buys.)

Usage: ``python -m bench.delta --json out.json [--model-mb 100] [--chunk-avg-kb 1024]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._fleet import (
    Fleet,
    cached_mlp,
    chunking_env,
    model_cache_dir,
    parse_env_pairs,
    plan_mlp,
    sigterm_raises,
)
from modelfleet.zoo import mlp_bytes

TARGETS = {"delta_ratio": 0.15}
MODEL_NAME = "bench-delta"
FIXED_BLOCK = 1024 * 1024
#: The benchmark's model shape: 16 MB layers (2048×2048 float32) once the size allows two.
WIDTH = 2048


def _blocks(path: Path, size: int) -> list[tuple[str, int]]:
    """(sha256, length) of consecutive fixed-size blocks."""
    out = []
    with path.open("rb") as f:
        while block := f.read(size):
            out.append((hashlib.sha256(block).hexdigest(), len(block)))
    return out


def _cdc(path: Path, avg_kb: int) -> list[tuple[str, int]]:
    """(sha256, length) of the chunks central's chunker cuts with these bounds."""
    from central.registry.chunker import Chunker
    from central.settings import ChunkingSettings

    avg = avg_kb * 1024
    chunker = Chunker(ChunkingSettings(avg_bytes=avg, min_bytes=avg // 4, max_bytes=avg * 4))
    return [(hashlib.sha256(c).hexdigest(), len(c)) for c in chunker.cut(path)]


def new_bytes_ratio(old: list[tuple[str, int]], new: list[tuple[str, int]]) -> float:
    """Share of ``new``'s bytes in pieces whose hash is not among ``old``'s (each new digest counted once)."""
    have = {d for d, _ in old}
    seen: set[str] = set()
    missing = 0
    for d, n in new:
        if d not in have and d not in seen:
            missing += n
            seen.add(d)
    total = sum(n for _, n in new)
    return missing / total if total else 0.0


def _shifted_copy(src: Path, dst: Path) -> Path:
    """``src`` with a doc_string set: every byte after the model header moves."""
    import onnx

    if dst.is_file():
        return dst
    model = onnx.load(str(src))
    model.doc_string = "fine-tuned copy; this text shifts every later byte of the file"
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".shift-", suffix=".onnx")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dst


def _edge_fetch(fleet: Fleet) -> dict[str, Any]:
    fetch: dict[str, Any] = fleet.edge_status("e0")["fetch"]
    return fetch


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Generate v1/v2, run the fleet, compute the local baselines."""
    target = int(args.model_mb * 1e6)
    width, layers = plan_mlp(target, WIDTH if mlp_bytes(WIDTH, 2) <= target else None)
    cache = model_cache_dir(args.model_cache)
    v1 = cached_mlp(cache, width=width, hidden_layers=layers, head_seed=0)
    v2 = cached_mlp(cache, width=width, hidden_layers=layers, head_seed=1)
    model_bytes = v2.stat().st_size
    # The delta of the uploaded FP32 file is measured; INT8 artifacts are chunked the same way.
    central_env = {
        "MODELFLEET_QUANTIZE__ENABLED": "false",
        **chunking_env(args.chunk_avg_kb),
        **parse_env_pairs(args.central_env),
    }
    edge_env = parse_env_pairs(args.edge_env)
    print(
        f"model {v1.name}: {model_bytes / 1e6:.1f} MB (width {width}, {layers} hidden layers); "
        f"chunks ~{args.chunk_avg_kb} KiB; v2 changes the last layer only",
        flush=True,
    )
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.gettempdir())
    with Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep) as fleet:
        fleet.start(1)
        p1 = fleet.push(MODEL_NAME, "v1", v1)
        d1 = fleet.wait_complete(MODEL_NAME, "v1", timeout_s=args.timeout_s)
        before = _edge_fetch(fleet)
        p2 = fleet.push(MODEL_NAME, "v2", v2)
        d2 = fleet.wait_complete(MODEL_NAME, "v2", timeout_s=args.timeout_s)
        after = _edge_fetch(fleet)
        verified = fleet.verify_files(MODEL_NAME, "v2", p2.sha256)["e0"]
    delta = after["bytes_fetched"] - before["bytes_fetched"]
    shared = set(c["digest"] for c in p1.manifest["chunks"]) & set(c["digest"] for c in p2.manifest["chunks"])
    v2_new_chunks = [c for c in p2.manifest["chunks"] if c["digest"] not in shared]
    fixed_v1, fixed_v2 = _blocks(v1, FIXED_BLOCK), _blocks(v2, FIXED_BLOCK)
    shifted = _shifted_copy(v1, cache / f"{v1.stem}-shifted.onnx")
    cdc_v1 = _cdc(v1, args.chunk_avg_kb)
    delta_ratio = delta / model_bytes
    return {
        "model_bytes": model_bytes,
        "v1_bytes": p1.size,
        "delta_bytes_fetched": delta,
        "delta_ratio": delta_ratio,
        "fixed_chunk_delta_ratio": new_bytes_ratio(fixed_v1, fixed_v2),
        "cdc_delta_ratio_local": new_bytes_ratio(cdc_v1, _cdc(v2, args.chunk_avg_kb)),
        "shifted_cdc_delta_ratio": new_bytes_ratio(cdc_v1, _cdc(shifted, args.chunk_avg_kb)),
        "shifted_fixed_chunk_delta_ratio": new_bytes_ratio(fixed_v1, _blocks(shifted, FIXED_BLOCK)),
        "v1_chunks": len(p1.manifest["chunks"]),
        "v2_chunks": len(p2.manifest["chunks"]),
        "v2_new_chunks": len(v2_new_chunks),
        "v1_bytes_fetched": before["bytes_fetched"],
        "v1_rollout_s": d1["e0"].completed_at - p1.acked_at,
        "v2_rollout_s": d2["e0"].completed_at - p2.acked_at,
        "v2_cache_hits": after["cache_hits"] - before["cache_hits"],
        "v2_file_verified": verified,
        "targets": dict(TARGETS),
        "met": {"delta_ratio": delta_ratio <= TARGETS["delta_ratio"], "file_verified": verified},
        "settings": {
            "width": width,
            "hidden_layers": layers,
            "chunk_avg_kb": args.chunk_avg_kb,
            "fixed_block_bytes": FIXED_BLOCK,
            "central_env": central_env,
            "edge_env": edge_env,
        },
    }


def _print(result: dict[str, Any]) -> None:
    r = result
    print(
        f"model {r['model_bytes'] / 1e6:.1f} MB, {r['v1_chunks']} chunks; v2 adds {r['v2_new_chunks']} new chunks\n"
        f"edge fetched {r['delta_bytes_fetched'] / 1e6:.2f} MB for v2: delta_ratio {r['delta_ratio']:.4f} "
        f"(target <= {r['targets']['delta_ratio']}), met={r['met']}\n"
        f"baselines (local): fixed 1 MiB blocks {r['fixed_chunk_delta_ratio']:.4f}, "
        f"CDC {r['cdc_delta_ratio_local']:.4f}; with a shifted header: "
        f"fixed {r['shifted_fixed_chunk_delta_ratio']:.4f}, CDC {r['shifted_cdc_delta_ratio']:.4f}\n"
        f"v1 rollout {r['v1_rollout_s']:.2f}s, v2 rollout {r['v2_rollout_s']:.2f}s, "
        f"v2 file verified {r['v2_file_verified']}"
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.delta", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--model-mb", type=float, default=100.0, help="model size, at least this many MB (1e6 bytes)")
    p.add_argument("--chunk-avg-kb", type=int, default=1024, help="average chunk size in KiB (min avg/4, max avg×4)")
    p.add_argument("--edge-env", action="append", default=[], metavar="K=V", help="extra env var for the edge")
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument("--timeout-s", type=float, default=300.0, help="timeout of each version's rollout")
    p.add_argument("--work-dir", type=Path, default=None, help="where the fleet's temp dir goes (default: system temp)")
    p.add_argument("--model-cache", type=Path, default=None, help="generated models are kept here")
    p.add_argument("--keep", action="store_true", help="keep the fleet's data dirs and logs")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print, write the JSON."""
    args = build_parser().parse_args(argv)
    if args.model_mb <= 0:
        print("--model-mb must be positive", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
    _print(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
