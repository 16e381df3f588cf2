"""Site-aware placement: owners in every site, the home site spread over sites, loads
bounded per site, sticky leaves, and exactly the old placement when sites do not matter."""

from __future__ import annotations

import hashlib
import math

from central.membership import NodeDirectory, NodeRecord
from central.placement import (
    PlacementService,
    RingMember,
    home_site_counts,
    load_by_node,
    place,
    place_by_site,
    site_order,
)

V1 = ("resnet", "1")
SIZES = {"east": 3, "west": 2, "north": 4}


def digests(count: int, salt: str = "chunk") -> list[str]:
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(count)]


def members(sizes: dict[str, int] = SIZES) -> list[RingMember]:
    return [RingMember(f"{site}-{j}", 1, site) for site, n in sizes.items() for j in range(n)]


def site_of(ring: list[RingMember]) -> dict[str, str]:
    return {m.node_id: m.site for m in ring}


def pairs(placement: dict[str, list[str]]) -> set[tuple[str, str]]:
    return {(d, o) for d, owners in placement.items() for o in owners}


def test_every_chunk_has_its_replicas_inside_every_site() -> None:
    ring = members()
    where = site_of(ring)
    placement = place_by_site(digests(300), ring, replicas=2)
    for owners in placement.values():
        assert len(set(owners)) == len(owners)
        per_site = {site: [o for o in owners if where[o] == site] for site in SIZES}
        assert {site: len(o) for site, o in per_site.items()} == {"east": 2, "west": 2, "north": 2}
        # Interleaved by rank: the first owner of every site comes before any second owner.
        assert {where[o] for o in owners[: len(SIZES)]} == set(SIZES)


def test_a_site_smaller_than_the_replica_count_gives_every_member() -> None:
    ring = members({"big": 5, "lone": 1})
    placement = place_by_site(digests(50), ring, replicas=3)
    for owners in placement.values():
        assert "lone-0" in owners
        assert len(owners) == 4
        assert owners.index("lone-0") in (0, 1)  # one rank-0 owner per site lead the list


def test_home_sites_take_turns_by_capacity() -> None:
    equal = members({"a": 3, "b": 3, "c": 3})
    counts = home_site_counts(place_by_site(digests(900), equal, replicas=2), site_of(equal))
    assert set(counts) == {"a", "b", "c"}
    assert all(240 <= n <= 360 for n in counts.values()), counts  # 300 each, about

    weighted = [RingMember("big-0", 3, "big"), RingMember("small-0", 1, "small")]
    counts = home_site_counts(place_by_site(digests(900), weighted, replicas=1), site_of(weighted))
    assert 600 <= counts["big"] <= 750, counts  # 675 expected: three quarters of the capacity


def test_loads_are_bounded_inside_each_site() -> None:
    ring = members()
    where = site_of(ring)
    ds = digests(400)
    loads = load_by_node(place_by_site(ds, ring, replicas=2))
    for node, load in loads.items():
        size = SIZES[where[node]]
        assert load <= math.ceil(1.25 * len(ds) * min(2, size) / size), node


def test_site_order_is_stable_when_a_site_goes() -> None:
    weights = {"a": 1, "b": 2, "c": 1, "d": 3}
    for d in digests(50):
        full = site_order(d, weights)
        fewer = site_order(d, {s: w for s, w in weights.items() if s != "c"})
        assert fewer == [s for s in full if s != "c"]


def test_leave_moves_only_the_leavers_pairs_to_its_own_site() -> None:
    svc = PlacementService(site_aware=True)
    ring = members()
    for m in ring:
        svc.join(m)
    ds = digests(200)
    svc.set_versions({V1: ds})
    before = svc.placement(V1)
    assert svc.leave("north-1") is True
    after = svc.placement(V1)
    held = {p for p in pairs(before) if p[1] == "north-1"}
    assert pairs(before) - pairs(after) == held
    gained = pairs(after) - pairs(before)
    assert len(gained) == len(held)
    assert {site_of(ring)[o] for _, o in gained} == {"north"}
    for d, owners in before.items():  # the home site's first owner stays unless it left
        if owners[0] != "north-1":
            assert after[d][0] == owners[0]


def test_a_whole_site_leaving_keeps_the_others_placement() -> None:
    svc = PlacementService(site_aware=True)
    for m in members():
        svc.join(m)
    ds = digests(120)
    svc.set_versions({V1: ds})
    before = svc.placement(V1)
    for j in range(SIZES["west"]):
        svc.leave(f"west-{j}")
    after = svc.placement(V1)
    assert after == {d: [o for o in owners if not o.startswith("west-")] for d, owners in before.items()}


def test_origin_rule_gives_each_site_one_way_in() -> None:
    svc = PlacementService(site_aware=True)
    ring = members()
    for m in ring:
        svc.join(m)
    ds = digests(30)
    svc.set_versions({V1: ds})
    for d in ds:
        owners = svc.owners(d)
        firsts = owners[: len(SIZES)]  # each site's rank-0 owner
        assert svc.origin_allowed(d, firsts[0], [])[0] is True
        for k, node in enumerate(firsts[1:], start=1):
            assert svc.origin_allowed(d, node, [])[0] is False
            assert svc.origin_allowed(d, node, firsts[:k])[0] is True  # every site ahead failed


def test_site_aware_off_or_one_site_is_the_plain_ring() -> None:
    ds = digests(150)
    ring = members()
    off = PlacementService(site_aware=False)
    one_site = PlacementService(site_aware=True)
    plain = [RingMember(m.node_id) for m in ring]
    for m, p in zip(ring, plain, strict=True):
        off.join(m)
        one_site.join(p)
    off.set_versions({V1: ds})
    one_site.set_versions({V1: ds})
    assert off.placement(V1) == place(ds, plain) == one_site.placement(V1)
    off.leave("east-0")
    one_site.leave("east-0")
    assert off.placement(V1) == one_site.placement(V1)


def test_a_follower_restores_the_leaders_site_aware_placement() -> None:
    leader, follower = PlacementService(site_aware=True), PlacementService(site_aware=True)
    ds = digests(60)
    for m in members():
        leader.join(m)
    follower.join(RingMember("east-0", 1, "east"))  # a follower that has seen fewer nodes
    leader.set_versions({V1: ds})
    follower.set_versions({V1: ds})
    assert follower.restore(leader.export()) == 1
    assert follower.placement(V1) == leader.placement(V1)


def test_the_node_directory_puts_each_node_in_its_site() -> None:
    svc = PlacementService(site_aware=True)
    directory = NodeDirectory(svc, lambda: None)
    directory.register(NodeRecord("e1", "127.0.0.1:1", "", site="east"))
    directory.register(NodeRecord("w1", "127.0.0.1:2", "", site="west"))
    svc.set_versions({V1: digests(20)})
    assert [(m.node_id, m.site) for m in svc.members()] == [("e1", "east"), ("w1", "west")]
    assert all(sorted(owners) == ["e1", "w1"] for owners in svc.placement(V1).values())
    directory.register(NodeRecord("w1", "127.0.0.1:2", "", site="east"))  # moved: re-placed
    assert all(len(owners) == 2 for owners in svc.placement(V1).values())
    assert svc.members()[1].site == "east"
