"""The cost preview's model on hand-made manifests and placements (pure, no servers): which
artifacts a node fetches, which chunks it reuses, which source each chunk comes from, and
how the sites add up."""

from __future__ import annotations

from central.rollout.cost import (
    PIN_LABEL,
    PreviewNode,
    artifacts_to_fetch,
    owner_map,
    preview_costs,
    site_totals,
)
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest


def _chunks(*names: str) -> list[ChunkRef]:
    return [ChunkRef(digest=n, size=100 * len(n)) for n in names]


def _manifest(version: str, fp32: list[str], int8: list[str] | None = None, **labels: str) -> Manifest:
    alternatives = []
    if int8 is not None:
        alternatives = [ArtifactRef(artifact="int8", sha256="i", size=1, chunks=_chunks(*int8))]
    return Manifest(
        name="m", version=version, sha256="f", size=1, chunks=_chunks(*fp32), created_at="now",
        alternatives=alternatives, labels=labels,
    )  # fmt: skip


def test_artifacts_follow_the_edges_choice() -> None:
    m = _manifest("2", ["a", "b"], ["c"])
    assert [a.artifact for a in artifacts_to_fetch(m, None)] == ["fp32", "int8"]  # no verdict: time both
    assert [a.artifact for a in artifacts_to_fetch(m, None, timing=False)] == ["fp32"]
    assert [a.artifact for a in artifacts_to_fetch(m, "int8")] == ["int8"]
    pinned = _manifest("2", ["a"], ["c"], **{PIN_LABEL: "fp32"})
    assert [a.artifact for a in artifacts_to_fetch(pinned, "int8")] == ["fp32"]  # a pin beats a verdict


def test_owners_of_a_shared_chunk_are_those_of_the_first_version() -> None:
    owners = owner_map([("m", "2"), ("m", "1")], {("m", "1"): {"a": ["x"]}, ("m", "2"): {"a": ["y"], "b": ["y"]}})
    assert owners == {"a": ["x"], "b": ["y"]}


def test_sources_reuse_and_seeding() -> None:
    target = _manifest("2", ["aa", "bbb", "c"])
    placement = {"aa": ["e1", "w1"], "bbb": ["w1", "e1"], "c": ["e1", "w1"]}
    nodes = [
        PreviewNode("e1", "east", True, ("fp32",), frozenset({"c"})),  # holds c from the version it serves
        PreviewNode("e2", "east", True, ("fp32",)),
        PreviewNode("w1", "west", False),  # no target, but an owner: seeds
        PreviewNode("w2", "west", False),  # neither: absent
    ]
    costs = {c.node_id: c for c in preview_costs(target, nodes, placement, placement)}
    assert set(costs) == {"e1", "e2", "w1"}
    e1, e2, w1 = costs["e1"], costs["e2"], costs["w1"]
    # e1: first owner of aa (central); bbb from w1 ahead of it (other site); c held.
    assert (e1.bytes_from_central, e1.bytes_from_other_sites, e1.bytes_reused) == (200, 300, 100)
    # e2 owns nothing: aa and c from e1 (same site first), bbb from e1 too (same site before w1).
    assert (e2.bytes_from_own_site, e2.bytes_from_other_sites, e2.bytes_from_central) == (600, 0, 0)
    # w1 seeds all three: bbb from central (first owner), aa and c from e1 ahead of it.
    assert (w1.bytes_total, w1.bytes_from_central, w1.bytes_from_other_sites) == (600, 300, 300)
    sites = {s.site: s for s in site_totals(costs.values())}
    assert sites["east"].bytes_in == 500 and sites["west"].bytes_in == 600


def test_without_placement_every_node_fetches_from_central() -> None:
    target = _manifest("1", ["aa", "b"])
    unowned: dict[str, list[str]] = {"aa": [], "b": []}
    nodes = [PreviewNode(n, "s", True, ("fp32",)) for n in ("n1", "n2")]
    costs = preview_costs(target, nodes, unowned, unowned)
    assert [(c.bytes_total, c.bytes_from_central) for c in costs] == [(300, 300), (300, 300)]


def test_an_owner_serving_another_artifact_fetches_its_owned_chunks_only_to_relay() -> None:
    target = _manifest("2", ["aa"], ["c"])  # fp32 is aa, int8 is c
    placement = {"aa": ["t1", "s1"], "c": ["t1", "s1"]}
    nodes = [
        PreviewNode("t1", "x", True, ("int8",)),  # serves int8 (its class's verdict): seeds no fp32
        PreviewNode("t2", "x", True, ("int8",)),
        PreviewNode("s1", "x", False),  # not targeted, owns both: seeds both, asking t1 first
    ]
    costs = {c.node_id: c for c in preview_costs(target, nodes, placement, placement)}
    # t1 fetches c to serve it and aa only because s1 asks it for aa (a relay): both from central.
    assert (costs["t1"].bytes_total, costs["t1"].bytes_from_central) == (300, 300)
    assert (costs["t2"].bytes_total, costs["t2"].bytes_from_own_site) == (100, 100)
    assert (costs["s1"].bytes_total, costs["s1"].bytes_from_own_site) == (300, 300)
    alone = preview_costs(
        target, nodes[:2], {"aa": ["t1", "t2"], "c": ["t1", "t2"]}, {"aa": ["t1", "t2"], "c": ["t1", "t2"]}
    )
    assert sum(c.bytes_total for c in alone) == 200  # nobody serves or seeds fp32: aa is never fetched
