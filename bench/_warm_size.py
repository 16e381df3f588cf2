"""The warm-start benchmark's size section: does a warm restart slow down with the model's size?

Two fleets in turn, each a central with quantization off (each model served as pushed) and
one edge: the digits model, then a random embedding table of ``--big-mb`` MiB in external
data (``modelfleet.zoo.external.write_embedding_table``, built in a temp dir and deleted
after). ONNX Runtime maps that table instead of copying it, so its session starts in
milliseconds at any size: what grows with the size is what the edge itself does with the
bytes. Per fleet: a cold start (fetch, assemble, verified records written), then per repeat
two warm restarts on the same data dir, one as shipped (files whose stat did not change since
they were verified are not read) and one with ``MODELFLEET_VERSIONS__REHASH_ALL=true`` (every
file re-hashed at start: what every start did before the records). Both fleets stay up and
their restarts alternate, so both models see the same load on the machine.

``big_over_small`` = warm ready (big) / warm ready (digits), target <= 1.5;
``big_over_small_rehash``: the same with re-hashing, the figure before the records. Each warm
start's ``verification`` counters (``/api/v1/status``) say how many model bytes it re-hashed.
Between restarts the model may stay in the page cache, so a re-hash may read memory (its best
case) or, once other processes pushed it out, the disk."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._edge_start import median_of, time_start
from bench._fleet import Fleet, Pushed, parse_env_pairs
from modelfleet.zoo import build_digits
from modelfleet.zoo.external import write_embedding_table

__all__ = ["REHASH_ENV", "size_section"]

#: What turns the verified records off in an edge: every start re-hashes every file.
REHASH_ENV = {"MODELFLEET_VERSIONS__REHASH_ALL": "true"}
_QUANTIZE_OFF = {"MODELFLEET_QUANTIZE__ENABLED": "false"}
VERSION = "v1"
SMALL, BIG = "digits", "embedding"


def size_section(args: argparse.Namespace, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Cold start, then warm restarts with and without re-hashing, for the digits model and
    the ``args.big_mb`` MiB table; the medians, ratios and every run."""
    digits = build_digits()
    with tempfile.TemporaryDirectory(prefix="warm-big-", dir=work) as tmp, contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        big_dir = Path(tmp) / BIG
        write_embedding_table(big_dir, total_bytes=args.big_mb * 1024 * 1024)
        log(f"size: built a {args.big_mb} MiB embedding table in {time.monotonic() - t0:.1f} s")
        small = _Served.start(stack, args, work, SMALL, lambda f: f.push_files(SMALL, VERSION, digits.onnx_path))
        big = _Served.start(stack, args, work, BIG, lambda f: f.push_folder(BIG, VERSION, big_dir))
        log(f"size: cold starts {_fmt(small.cold['ready_s'])} s (digits), {_fmt(big.cold['ready_s'])} s ({BIG})")
        for i in range(args.repeats):  # interleaved, so both models see the same load on the machine
            for kind, env in (("warm", None), ("warm_rehash", REHASH_ENV)):
                for served in (small, big):
                    served.restart(kind, env)
            warm, rehash = (f"{_fmt(small.last(k))} s / {_fmt(big.last(k))} s" for k in ("warm", "warm_rehash"))
            log(f"  size repeat {i} (digits / {BIG}): warm {warm}; re-hashing {rehash}")
    small_doc, big_doc = small.summary(), big.summary()
    small_s, big_s = small_doc["warm_ready_s"], big_doc["warm_ready_s"]
    small_r, big_r = small_doc["warm_rehash_ready_s"], big_doc["warm_rehash_ready_s"]
    return {
        "big_mb": args.big_mb,
        "small_warm_ready_s": small_s,
        "big_warm_ready_s": big_s,
        "small_warm_rehash_ready_s": small_r,
        "big_warm_rehash_ready_s": big_r,
        "big_over_small": big_s / small_s if small_s and big_s is not None else None,
        "big_over_small_rehash": big_r / small_r if small_r and big_r is not None else None,
        "big_warm_bytes_rehashed": big.most_rehashed("warm"),
        "big_warm_rehash_bytes_rehashed": big.most_rehashed("warm_rehash"),
        "small": small_doc,
        "big": big_doc,
    }


class _Served:
    """One fleet (central, quantization off) serving one model to one edge, kept up while the
    other model's fleet runs too, so their restarts can be interleaved."""

    def __init__(self, args: argparse.Namespace, fleet: Fleet, name: str, pushed: Pushed) -> None:
        self.args, self.fleet, self.name, self.pushed = args, fleet, name, pushed
        self.node = f"size-{name}"
        self.cold: dict[str, Any] = {}
        self.runs: dict[str, list[dict[str, Any]]] = {"warm": [], "warm_rehash": []}

    @classmethod
    def start(
        cls,
        stack: contextlib.ExitStack,
        args: argparse.Namespace,
        work: Path,
        name: str,
        push: Callable[[Fleet], Pushed],
    ) -> _Served:
        """Start the fleet (stopped when ``stack`` closes), push, then one timed cold start."""
        central_env = {**_QUANTIZE_OFF, **parse_env_pairs(args.central_env)}
        edge_env = parse_env_pairs(args.edge_env)
        fleet = stack.enter_context(Fleet(root=work, central_env=central_env, edge_env=edge_env, keep=args.keep))
        fleet.start_central()
        served = cls(args, fleet, name, push(fleet))
        served.cold = time_start(fleet, served.node, name, args.big_timeout_s)
        served.cold["stop_rc"] = fleet.stop_edge(served.node)
        return served

    def restart(self, kind: str, env: dict[str, str] | None) -> None:
        """One timed warm restart on the same data dir (``env`` added), then SIGTERM."""
        run = time_start(self.fleet, self.node, self.name, self.args.timeout_s, env)
        run["stop_rc"] = self.fleet.stop_edge(self.node)
        self.runs[kind].append(run)

    def last(self, kind: str) -> float | None:
        """The latest ``kind`` restart's seconds to ready."""
        ready: float | None = self.runs[kind][-1]["ready_s"]
        return ready

    def most_rehashed(self, kind: str) -> int | None:
        """The most model bytes any ``kind`` restart re-hashed (its ``verification`` counters)."""
        counts = [r["verification"].get("bytes_rehashed") for r in self.runs[kind]]
        return max((c for c in counts if c is not None), default=None)

    def summary(self) -> dict[str, Any]:
        """The medians and every run."""
        m = self.pushed.manifest
        runs = [self.cold, *self.runs["warm"], *self.runs["warm_rehash"]]
        return {
            "model": self.name,
            "artifact": m.get("artifact"),
            "model_bytes": int(m.get("size", 0)) + sum(int(f.get("size", 0)) for f in m.get("files", [])),
            "cold_ready_s": self.cold["ready_s"],
            "warm_ready_s": median_of([r["ready_s"] for r in self.runs["warm"]]),
            "warm_rehash_ready_s": median_of([r["ready_s"] for r in self.runs["warm_rehash"]]),
            "runs": {"cold": self.cold, **self.runs},
            "errors": [r["error"] for r in runs if r["error"]],
        }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
