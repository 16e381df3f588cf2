"""Placement benchmark: load balance and churn of bounded-load consistent hashing.

Checks the two numbers the placement design promises: no edge owns more than
``load_factor`` times its share (max/mean <= 1.25), and a leaving edge moves
about ``1/N`` of the pairs (moved/ideal <= 1.2). Plain consistent hashing is run
side by side so readers see what the load bound buys. Fully deterministic:
digests are sha256 of ``chunk-{i}`` and node ids are ``edge-{j:03d}``.

Usage: ``python -m bench.placement --json out.json [--sizes 4,8,32,100]
[--chunks-per-node 4,8,16,32,64] [--replicas 2]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from central.placement.ring import (
    Placement,
    RingMember,
    max_over_mean,
    moved_fraction,
    place,
)

LOAD_FACTOR = 1.25
TARGETS = {"max_over_mean": 1.25, "moved_over_ideal": 1.2}
#: Rings up to this size simulate every leaver; larger ones sample ``SAMPLED_LEAVERS``.
ALL_LEAVERS_UP_TO = 32
SAMPLED_LEAVERS = 20


def _digests(count: int) -> list[str]:
    """Deterministic stand-in chunk digests."""
    return [hashlib.sha256(f"chunk-{i}".encode()).hexdigest() for i in range(count)]


def _leavers(members: Sequence[RingMember]) -> list[RingMember]:
    """Every member for small rings, else evenly spaced samples (keeps N=100 quick)."""
    if len(members) <= ALL_LEAVERS_UP_TO:
        return list(members)
    step = len(members) / SAMPLED_LEAVERS
    return [members[int(i * step)] for i in range(SAMPLED_LEAVERS)]


def _leave_fractions(
    digests: Sequence[str],
    members: Sequence[RingMember],
    canonical: Placement,
    replicas: int,
) -> list[float]:
    """Moved fraction when each (sampled) member leaves, in sticky mode as central does."""
    moved: list[float] = []
    for leaver in _leavers(members):
        rest = [m for m in members if m != leaver]
        sticky = place(
            digests,
            rest,
            replicas=replicas,
            load_factor=LOAD_FACTOR,
            previous=canonical,
        )
        moved.append(moved_fraction(canonical, sticky))
    return moved


def run_case(nodes: int, chunks_per_node: int, replicas: int) -> dict[str, Any]:
    """Measure one (ring size, chunks per node) case."""
    digests = _digests(nodes * chunks_per_node)
    members = [RingMember(f"edge-{j:03d}") for j in range(nodes)]
    canonical = place(digests, members, replicas=replicas, load_factor=LOAD_FACTOR)
    unbounded = place(digests, members, replicas=replicas, load_factor=math.inf)
    moved = _leave_fractions(digests, members, canonical, replicas)
    ideal = 1.0 / nodes
    mean_moved = sum(moved) / len(moved) if moved else 0.0
    return {
        "nodes": nodes,
        "chunks_per_node": chunks_per_node,
        "max_over_mean": max_over_mean(canonical, members),
        "unbounded_max_over_mean": max_over_mean(unbounded, members),
        "moved_fraction_on_leave": mean_moved,
        "moved_fraction_on_leave_max": max(moved, default=0.0),
        "ideal_moved_fraction": ideal,
        "moved_over_ideal": mean_moved / ideal,
        "moved_over_ideal_max": max(moved, default=0.0) / ideal,
        "leavers_sampled": len(moved),
    }


def run(sizes: Sequence[int], chunks_per_node: Sequence[int], replicas: int) -> dict[str, Any]:
    """Run every case and summarise against the targets."""
    cases = [run_case(n, k, replicas) for n in sizes for k in chunks_per_node]
    worst_mom = max((c["max_over_mean"] for c in cases), default=0.0)
    worst_moi = max((c["moved_over_ideal"] for c in cases), default=0.0)
    return {
        "replicas": replicas,
        "load_factor": LOAD_FACTOR,
        "cases": cases,
        "worst_max_over_mean": worst_mom,
        "worst_moved_over_ideal": worst_moi,
        "worst_moved_over_ideal_max": max((c["moved_over_ideal_max"] for c in cases), default=0.0),
        "worst_unbounded_max_over_mean": max((c["unbounded_max_over_mean"] for c in cases), default=0.0),
        "targets": dict(TARGETS),
        "met": {
            "max_over_mean": worst_mom <= TARGETS["max_over_mean"],
            "moved_over_ideal": worst_moi <= TARGETS["moved_over_ideal"],
        },
    }


_COLUMNS = (
    ("nodes", "N", "{}"),
    ("chunks_per_node", "k", "{}"),
    ("max_over_mean", "max/mean", "{:.3f}"),
    ("unbounded_max_over_mean", "unb. max/mean", "{:.3f}"),
    ("moved_fraction_on_leave", "moved", "{:.4f}"),
    ("moved_fraction_on_leave_max", "moved max", "{:.4f}"),
    ("ideal_moved_fraction", "1/N", "{:.4f}"),
    ("moved_over_ideal", "moved/ideal", "{:.3f}"),
    ("moved_over_ideal_max", "max/ideal", "{:.3f}"),
)


def _rows(result: dict[str, Any]) -> list[list[str]]:
    """Formatted table cells, one row per case."""
    return [[fmt.format(case[key]) for key, _, fmt in _COLUMNS] for case in result["cases"]]


def _print_rich(result: dict[str, Any]) -> bool:
    """Print the table with rich; False when rich is not installed."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    table = Table(title=f"placement (replicas={result['replicas']}, c={LOAD_FACTOR})")
    for _, title, _ in _COLUMNS:
        table.add_column(title, justify="right", no_wrap=True)
    for row in _rows(result):
        table.add_row(*row)
    # Rich defaults to 80 columns off a terminal, which truncates the cells.
    Console(width=max(Console().width, 112)).print(table)
    return True


def _print_table(result: dict[str, Any]) -> None:
    """Show the cases with rich when available, plain text otherwise, then the verdict."""
    if not _print_rich(result):
        print("  ".join(title for _, title, _ in _COLUMNS))
        for row in _rows(result):
            print("  ".join(row))
    print(
        f"worst max/mean {result['worst_max_over_mean']:.3f} "
        f"(target {TARGETS['max_over_mean']}), worst moved/ideal "
        f"{result['worst_moved_over_ideal']:.3f} (target {TARGETS['moved_over_ideal']}), "
        f"met={result['met']}"
    )


def _int_list(text: str) -> list[int]:
    """Parse ``4,8,32`` into positive ints (argparse type)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print the table, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--sizes", type=_int_list, default=[4, 8, 32, 100])
    parser.add_argument("--chunks-per-node", type=_int_list, default=[4, 8, 16, 32, 64])
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args(argv)
    result = run(args.sizes, args.chunks_per_node, args.replicas)
    _print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
