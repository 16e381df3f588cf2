"""Site-aware placement benchmark: balance inside each site, each site's share of first
owners, churn, and how many times a chunk crosses into a site, against one ring.

Crossings are counted from the fetch rules, not measured on a network (``bench.sites``
does that): a site holding an owner of a chunk takes it in once (its first owner fetches
from an earlier site or from origin; everyone else in the site fetches from an owner
inside, same site first); a site holding none takes it in once per edge. Site-aware
placement gives every site an owner, so a chunk crosses ``#sites`` times; one ring over
the fleet leaves some sites without an owner for some chunks. Deterministic: digests are
sha256 of ``chunk-{i}``, nodes ``{site}-{j:03d}``.

Usage: ``python -m bench.placement_sites --json out.json [--layouts 4x2,8x3,25x4,2+5+13]
[--chunks-per-node 32] [--replicas 2]``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.placement import _digests
from central.placement import (
    Placement,
    RingMember,
    home_site_counts,
    max_over_mean,
    moved_fraction,
    place,
    place_by_site,
)

LOAD_FACTOR = 1.25
#: Leavers simulated per case (spread over the sites).
LEAVERS = 8


def _members(sizes: Sequence[int]) -> list[RingMember]:
    return [RingMember(f"s{k}-{j:03d}", 1, f"s{k}") for k, n in enumerate(sizes) for j in range(n)]


def _parse_layout(text: str) -> list[int]:
    """``8x3`` (three sites of eight) or ``2+5+13`` (sites of those sizes)."""
    if "x" in text:
        per_site, sites = (int(part) for part in text.split("x"))
        return [per_site] * sites
    return [int(part) for part in text.split("+")]


def crossings(placement: Placement, sizes: Mapping[str, int], site_of: Mapping[str, str]) -> int:
    """Times the chunks enter a site, under the fetch rules (module docstring)."""
    total = 0
    for owners in placement.values():
        held = {site_of[o] for o in owners}
        total += sum(1 if site in held else n for site, n in sizes.items())
    return total


def _worst_site_balance(placement: Placement, members: Sequence[RingMember]) -> float:
    """Worst per-site max/mean, each site judged on its own owners."""
    worst = 0.0
    for site in {m.site for m in members}:
        group = [m for m in members if m.site == site]
        ids = {m.node_id for m in group}
        local = {d: [o for o in owners if o in ids] for d, owners in placement.items()}
        worst = max(worst, max_over_mean(local, group))
    return worst


def _moved_over_share(digests: Sequence[str], members: Sequence[RingMember], canonical: Placement, r: int) -> float:
    """Mean over sampled leavers of the moved fraction over the leaver's share of pairs: 1.0 when
    exactly its pairs move, less when its site shrinks below ``replicas`` (nothing to refill)."""
    ratios: list[float] = []
    step = max(1, len(members) // LEAVERS)
    for leaver in members[::step][:LEAVERS]:
        rest = [m for m in members if m != leaver]
        sticky = place_by_site(digests, rest, replicas=r, load_factor=LOAD_FACTOR, previous=canonical)
        held = sum(leaver.node_id in owners for owners in canonical.values())
        total = sum(len(owners) for owners in sticky.values())
        if held:
            ratios.append(moved_fraction(canonical, sticky) / (held / total))
    return sum(ratios) / len(ratios) if ratios else 0.0


def run_case(sizes: Sequence[int], chunks_per_node: int, replicas: int) -> dict[str, Any]:
    """Measure one layout."""
    members = _members(sizes)
    digests = _digests(len(members) * chunks_per_node)
    site_of = {m.node_id: m.site for m in members}
    site_sizes = {f"s{k}": n for k, n in enumerate(sizes)}
    aware = place_by_site(digests, members, replicas=replicas, load_factor=LOAD_FACTOR)
    ring = place(digests, members, replicas=replicas, load_factor=LOAD_FACTOR)
    homes = home_site_counts(aware, site_of)
    share = {s: homes.get(s, 0) / len(digests) / (n / len(members)) for s, n in site_sizes.items()}
    return {
        "sites": list(sizes),
        "chunks": len(digests),
        "worst_site_max_over_mean": _worst_site_balance(aware, members),
        "home_share_over_capacity_share": {"min": min(share.values()), "max": max(share.values())},
        "moved_over_leavers_share": _moved_over_share(digests, members, aware, replicas),
        "crossings_per_chunk": crossings(aware, site_sizes, site_of) / len(digests),
        "one_ring_crossings_per_chunk": crossings(ring, site_sizes, site_of) / len(digests),
    }


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: run, print one line per layout, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.placement_sites", description=__doc__)
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--layouts", default="4x2,8x3,25x4,2+5+13")
    parser.add_argument("--chunks-per-node", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args(argv)
    cases = [run_case(_parse_layout(t), args.chunks_per_node, args.replicas) for t in args.layouts.split(",")]
    for c in cases:
        home = c["home_share_over_capacity_share"]
        print(
            f"sites {'+'.join(map(str, c['sites'])):>10}: site max/mean {c['worst_site_max_over_mean']:.3f}"
            f"  home/capacity share {home['min']:.2f}..{home['max']:.2f}"
            f"  moved/leaver share {c['moved_over_leavers_share']:.3f}"
            f"  crossings/chunk {c['crossings_per_chunk']:.2f} (one ring {c['one_ring_crossings_per_chunk']:.2f})"
        )
    result = {"replicas": args.replicas, "load_factor": LOAD_FACTOR, "cases": cases}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
