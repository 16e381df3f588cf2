"""Consistent-hash placement of chunk digests with bounded loads.

Central spreads the chunks of every model version over the edge fleet so that
each chunk has ``r`` owners and only owners fetch it from origin. Plain
consistent hashing gives stable placement but lumpy loads; the bounded-loads
variant (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded
Loads") caps every node at ``ceil(c * share)`` so no edge carries much more
than its weighted share, while keeping the ring's stability.

Everything here is a pure function of its inputs: the digests are processed in
sorted order and the ring is built from the members sorted by id, so the result
does not depend on member order or on Python's hash seed (uhashring uses md5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from uhashring import HashRing

from fleetwire.transfer import DEFAULT_SITE

__all__ = [
    "Placement",
    "RingMember",
    "load_by_node",
    "max_over_mean",
    "moved_fraction",
    "place",
]

#: digest -> ordered owners; owners[0] is the first owner (fetches from origin).
Placement = dict[str, list[str]]


@dataclass(frozen=True)
class RingMember:
    """One edge node on the ring; ``capacity`` is its integer weight (>= 1), ``site`` where it
    is (read only by site-aware placement, ``central.placement.sites``)."""

    node_id: str
    capacity: int = 1
    site: str = DEFAULT_SITE

    def __post_init__(self) -> None:
        """Reject members the ring cannot represent, before they skew placement."""
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError("node_id must be a non-empty string")
        cap = self.capacity
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {cap!r}")


@lru_cache(maxsize=64)
def _ring_for(spec: tuple[tuple[str, int], ...]) -> Any:
    """Build (once per membership) the uhashring ring; building costs md5 per vnode.

    ``spec`` is sorted by node id so equal memberships share one cached ring and
    vnode insertion order is fixed. The ring is never mutated after creation.
    """
    return HashRing(nodes={node_id: {"weight": weight} for node_id, weight in spec})


def _check_params(replicas: int, load_factor: float) -> None:
    """Fail loudly on settings under which the bound would be meaningless."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    if math.isnan(load_factor) or load_factor < 1.0:
        raise ValueError(f"load_factor must be >= 1.0, got {load_factor!r}")


def _weights(members: Sequence[RingMember]) -> dict[str, int]:
    """Map node id -> weight, refusing duplicate ids (the ring would silently merge them)."""
    weights: dict[str, int] = {}
    for member in members:
        if member.node_id in weights:
            raise ValueError(f"duplicate ring member {member.node_id!r}")
        weights[member.node_id] = member.capacity
    return weights


def _caps(weights: Mapping[str, int], n_digests: int, r: int, load_factor: float) -> dict[str, int]:
    """Per-node slot caps: ``min(#digests, ceil(c * S * w_i / W))``.

    Exact rational arithmetic keeps ``ceil`` from rounding 160.0000001 up to
    161. A node can hold each digest at most once, hence the ``#digests`` bound;
    an infinite load factor leaves only that bound (plain consistent hashing).
    """
    if math.isinf(load_factor):
        return dict.fromkeys(weights, n_digests)
    total_weight = sum(weights.values())
    slots = Fraction(load_factor) * n_digests * r
    return {node: min(n_digests, math.ceil(slots * weight / total_weight)) for node, weight in weights.items()}


def _kept_owners(
    digests: Sequence[str],
    weights: Mapping[str, int],
    r: int,
    previous: Mapping[str, Sequence[str]],
    loads: dict[str, int],
) -> dict[str, list[str]]:
    """Sticky mode: surviving previous owners keep their slots, in order.

    They are kept even beyond the new caps because they already hold the bytes;
    moving them would cost transfer for no gain. Their slots count toward loads
    before any new slot is handed out, so the fill respects what is already there.
    """
    kept: dict[str, list[str]] = {}
    for digest in digests:
        owners: list[str] = []
        for node in previous.get(digest, ()):
            if node in weights and node not in owners and len(owners) < r:
                owners.append(node)
                loads[node] += 1
        kept[digest] = owners
    return kept


def _fill(
    ring: Any,
    digest: str,
    r: int,
    owners: list[str],
    loads: dict[str, int],
    caps: Mapping[str, int],
    weights: Mapping[str, int],
) -> None:
    """Append owners walking the ring from ``digest``, skipping nodes at their cap."""
    for conf in ring.range(digest, unique=True):
        node = conf["nodename"]
        if node in owners or loads[node] >= caps[node]:
            continue
        owners.append(node)
        loads[node] += 1
        if len(owners) == r:
            return
    _fill_ignoring_caps(r, owners, loads, weights)


def _fill_ignoring_caps(r: int, owners: list[str], loads: dict[str, int], weights: Mapping[str, int]) -> None:
    """Last resort when the ring walk found too few nodes under cap.

    Only happens with extreme weight skew, where the ``#digests`` bound makes the
    caps sum below the slot count. The rest go to the distinct nodes with the
    lowest load relative to their weight, ignoring caps, so every digest still
    gets ``r`` owners rather than silently fewer.
    """
    spare = sorted(
        (node for node in weights if node not in owners),
        key=lambda node: (loads[node] / weights[node], node),
    )
    for node in spare[: r - len(owners)]:
        owners.append(node)
        loads[node] += 1


def place(
    digests: Sequence[str],
    members: Sequence[RingMember],
    *,
    replicas: int = 2,
    load_factor: float = 1.25,
    previous: Mapping[str, Sequence[str]] | None = None,
) -> Placement:
    """Give every unique digest ``min(replicas, len(members))`` distinct owners.

    The result is keyed in first-appearance order of ``digests``; processing is
    in sorted digest order so the result is deterministic. With ``previous``
    (used when nodes leave), surviving owners are kept and only missing slots are
    filled, so a leaving node moves exactly the (digest, owner) pairs it held.
    """
    _check_params(replicas, load_factor)
    unique = list(dict.fromkeys(digests))
    if not members:
        return {digest: [] for digest in unique}
    weights = _weights(members)
    r = min(replicas, len(weights))
    caps = _caps(weights, len(unique), r, load_factor)
    ring = _ring_for(tuple(sorted(weights.items())))
    loads = dict.fromkeys(weights, 0)
    chosen = _kept_owners(unique, weights, r, previous or {}, loads)
    for digest in sorted(unique):
        owners = chosen[digest]
        if len(owners) < r:
            _fill(ring, digest, r, owners, loads, caps, weights)
    return {digest: chosen[digest] for digest in unique}


def _pairs(placement: Mapping[str, Sequence[str]]) -> set[tuple[str, str]]:
    """All (digest, owner) pairs: the unit of bytes held on an edge."""
    return {(digest, owner) for digest, owners in placement.items() for owner in owners}


def moved_fraction(old: Mapping[str, Sequence[str]], new: Mapping[str, Sequence[str]]) -> float:
    """Share of ``new``'s (digest, owner) pairs absent from ``old``: bytes that must move.

    A reorder of the same owners is not a move (no bytes travel). 0.0 when empty.
    """
    new_pairs = _pairs(new)
    if not new_pairs:
        return 0.0
    return len(new_pairs - _pairs(old)) / len(new_pairs)


def load_by_node(placement: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Number of digests each node owns (nodes owning nothing are absent), sorted by id."""
    loads: dict[str, int] = {}
    for owners in placement.values():
        for owner in owners:
            loads[owner] = loads.get(owner, 0) + 1
    return dict(sorted(loads.items()))


def max_over_mean(placement: Mapping[str, Sequence[str]], members: Sequence[RingMember]) -> float:
    """Worst member's load over its weighted share ``S * w_i / W``.

    With equal weights this is the classic max/mean load; with unequal weights
    each node is judged against what its capacity entitles it to. Members that
    own nothing count (with load 0). 0.0 for an empty placement or no members.
    """
    loads = load_by_node(placement)
    total_slots = sum(loads.values())
    total_weight = sum(member.capacity for member in members)
    if total_slots == 0 or total_weight == 0:
        return 0.0
    return max(loads.get(m.node_id, 0) * total_weight / (total_slots * m.capacity) for m in members)
