"""Site-aware placement: owners inside every site, so a chunk crosses each site's WAN link
about once.

Sites are groups of edges behind one link (a factory, a branch, a cloud region). With one
ring over the whole fleet a chunk's owners may all sit in one site, and every edge of
every other site then pulls it across its own link. Here each site with members gets
``min(replicas, site size)`` owners per chunk from a bounded-load ring over that site's
members only (``ring.place``, so loads are bounded per site and a leaver moves only its
own pairs, sticky as before). Every node holds every active version today, so every site
with at least one member has the capacity and takes part.

The per-site owners are merged into one ordered list by rank, sites interleaved:
``[home rank 0, next site rank 0, ..., home rank 1, next site rank 1, ...]``. The site
order is a weighted rendezvous hash of (digest, site), weighted by the site's capacity, so
each site is home (its rank-0 owner is ``owners[0]``) for its share of the chunks and the
order of two sites never depends on a third. What follows from the order:

- ``owners[0]`` alone fetches from origin (``service._ahead_all_failed`` is unchanged);
- every other site's rank-0 owner has only earlier sites' rank-0 owners ahead of it, so it
  pulls the chunk across the WAN once for its site;
- a site's later owners and its non-owners find an owner of their own site ahead of them,
  and the edge's fetcher tries those first (``edge_node.fetch.fetcher``).

With one site (or site awareness off) the result is exactly ``ring.place``'s.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

from central.placement.ring import Placement, RingMember, place

__all__ = ["home_site_counts", "place_by_site", "site_order"]


def site_order(digest: str, site_weights: Mapping[str, int]) -> list[str]:
    """Sites by weighted rendezvous score for ``digest``, home site first.

    Score ``-w / ln(u)`` with ``u`` uniform in (0, 1) from md5(digest, site): a site wins
    with probability ``w / W`` (Schindelhauer and Schomaker's weighted rendezvous), and
    removing a site leaves the order of the others unchanged.
    """

    def score(site: str) -> tuple[float, str]:
        raw = int.from_bytes(hashlib.md5(f"{digest}/{site}".encode()).digest()[:8], "big")
        u = (raw + 0.5) / 2**64
        return -site_weights[site] / math.log(u), site

    return sorted(site_weights, key=score, reverse=True)


def _by_site(members: Sequence[RingMember]) -> dict[str, list[RingMember]]:
    groups: dict[str, list[RingMember]] = {}
    for member in members:
        groups.setdefault(member.site, []).append(member)
    return dict(sorted(groups.items()))


def _interleave(lists: Sequence[Sequence[str]]) -> list[str]:
    """Rank 0 of every list in order, then rank 1 of every list, and so on."""
    merged: list[str] = []
    for rank in range(max((len(owners) for owners in lists), default=0)):
        merged.extend(owners[rank] for owners in lists if rank < len(owners))
    return merged


def place_by_site(
    digests: Sequence[str],
    members: Sequence[RingMember],
    *,
    replicas: int = 2,
    load_factor: float = 1.25,
    previous: Mapping[str, Sequence[str]] | None = None,
) -> Placement:
    """``ring.place`` per site, merged by rank with a per-digest home site (module docstring).

    ``previous`` (sticky mode, when nodes leave) is split by the members' current sites, so
    each site keeps its surviving owners, and each digest keeps its order of sites. One site
    or none: ``ring.place`` itself.
    """
    groups = _by_site(members)
    if len(groups) <= 1:
        return place(digests, members, replicas=replicas, load_factor=load_factor, previous=previous)
    site_of = {m.node_id: m.site for m in members}
    per_site: dict[str, Placement] = {}
    for site, group in groups.items():
        kept = None
        if previous is not None:
            kept = {d: [o for o in owners if site_of.get(o) == site] for d, owners in previous.items()}
        per_site[site] = place(digests, group, replicas=replicas, load_factor=load_factor, previous=kept)
    weights = {site: sum(m.capacity for m in group) for site, group in groups.items()}
    placement: Placement = {}
    for digest in dict.fromkeys(digests):
        order = site_order(digest, weights)
        if previous is not None:
            order = _kept_order(previous.get(digest, ()), site_of, order)
        placement[digest] = _interleave([per_site[site][digest] for site in order])
    return placement


def _kept_order(owners: Sequence[str], site_of: Mapping[str, str], order: Sequence[str]) -> list[str]:
    """Sticky mode: the sites in the order ``owners`` had them, then any others in ``order``.

    A leaver changes its site's capacity and so the rendezvous weights; keeping the old
    order keeps every other chunk's first owner (the one origin serves) where it was.
    """
    kept = list(dict.fromkeys(site_of[o] for o in owners if o in site_of))
    return kept + [site for site in order if site not in kept]


def home_site_counts(placement: Mapping[str, Sequence[str]], site_of: Mapping[str, str]) -> dict[str, int]:
    """Site → how many digests have their first owner (the one origin serves) there."""
    counts: dict[str, int] = {}
    for owners in placement.values():
        if owners:
            site = site_of[owners[0]]
            counts[site] = counts.get(site, 0) + 1
    return dict(sorted(counts.items()))
