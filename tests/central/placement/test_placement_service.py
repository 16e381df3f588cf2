"""Behaviour of PlacementService: membership churn, versions, origin protection."""

from __future__ import annotations

import hashlib

from central.placement import PlacementService, RingMember, place

V1 = ("resnet", "1")
V2 = ("bert", "3")


def digests(count: int, salt: str = "chunk") -> list[str]:
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(count)]


def service(nodes: int = 5, **kwargs: object) -> PlacementService:
    svc = PlacementService(**kwargs)  # type: ignore[arg-type]
    for j in range(nodes):
        svc.join(RingMember(f"edge-{j}"))
    return svc


def pairs(placement: dict[str, list[str]]) -> set[tuple[str, str]]:
    return {(d, o) for d, owners in placement.items() for o in owners}


def test_empty_membership_has_no_owners_and_origin_is_open() -> None:
    svc = PlacementService()
    ds = digests(4)
    svc.set_versions({V1: ds})
    assert svc.members() == []
    assert svc.placement(V1) == {d: [] for d in ds}
    assert svc.owners(ds[0]) == []
    assert svc.origin_allowed(ds[0], "edge-0", []) == (True, [])


def test_join_reports_change_and_recomputes_canonically() -> None:
    svc = service(4)
    ds = digests(80)
    svc.set_versions({V1: ds})
    assert svc.join(RingMember("edge-0")) is False
    assert svc.join(RingMember("edge-9")) is True
    members = svc.members()
    assert [m.node_id for m in members] == sorted(m.node_id for m in members)
    assert svc.placement(V1) == place(ds, members)
    assert "edge-9" in {o for owners in svc.placement(V1).values() for o in owners}
    assert svc.join(RingMember("edge-9", capacity=3)) is True
    assert svc.placement(V1) == place(ds, svc.members())


def test_leave_moves_only_the_leavers_pairs() -> None:
    svc = service(8)
    ds = digests(200)
    svc.set_versions({V1: ds})
    before = svc.placement(V1)
    assert svc.leave("nobody") is False
    assert svc.leave("edge-3") is True
    after = svc.placement(V1)
    held = {p for p in pairs(before) if p[1] == "edge-3"}
    assert pairs(before) - pairs(after) == held
    assert len(pairs(after) - pairs(before)) == len(held)
    for d, owners in before.items():
        if owners[0] != "edge-3":
            assert after[d][0] == owners[0]
    assert svc.owned_by("edge-3") == set()


def test_set_versions_adds_keeps_and_drops() -> None:
    svc = service(6)
    a, b = digests(30, "a"), digests(20, "b")
    svc.set_versions({V1: a})
    svc.leave("edge-1")  # sticky placement, differs from canonical
    sticky = svc.placement(V1)
    svc.set_versions({V1: a, V2: b})
    assert svc.placement(V1) == sticky
    assert set(svc.placement(V2)) == set(b)
    svc.set_versions({V2: b})
    assert svc.placement(V1) == {}
    assert svc.owners(a[0]) == []
    assert svc.owners(b[0]) == svc.placement(V2)[b[0]]


def test_owners_of_shared_digest_come_from_first_sorted_key() -> None:
    svc = service(6)
    shared = digests(1, "shared")
    svc.set_versions({V1: shared + digests(40, "a"), V2: shared + digests(3, "b")})
    first = min(V1, V2)
    assert svc.owners(shared[0]) == svc.placement(first)[shared[0]]


def test_owned_by_covers_every_version() -> None:
    svc = service(4)
    svc.set_versions({V1: digests(30, "a"), V2: digests(30, "b")})
    expected = {d for key in (V1, V2) for d, owners in svc.placement(key).items() if "edge-2" in owners}
    assert svc.owned_by("edge-2") == expected
    assert expected
    assert svc.owned_by("stranger") == set()


def test_origin_protection_rules() -> None:
    svc = service(5)
    ds = digests(10)
    svc.set_versions({V1: ds})
    d = ds[0]
    first, second = svc.owners(d)
    outsider = next(m.node_id for m in svc.members() if m.node_id not in (first, second))
    assert svc.origin_allowed(d, first, []) == (True, [first, second])
    assert svc.origin_allowed(d, second, [])[0] is False
    assert svc.origin_allowed(d, second, [first])[0] is True
    assert svc.origin_allowed(d, outsider, [first])[0] is False
    assert svc.origin_allowed(d, outsider, [first, second])[0] is True
    assert svc.origin_allowed("f" * 64, outsider, []) == (True, [])


def test_origin_allowed_if_any_version_allows() -> None:
    svc = service(8)
    shared = digests(1, "shared")[0]
    svc.set_versions({V1: [shared, *digests(60, "a")], V2: [shared, *digests(7, "b")]})
    lists = [svc.placement(key)[shared] for key in (V1, V2)]
    firsts = {owners[0] for owners in lists}
    for node in firsts:
        assert svc.origin_allowed(shared, node, [])[0] is True
    outsider = next(m.node_id for m in svc.members() if all(m.node_id not in o for o in lists))
    assert svc.origin_allowed(shared, outsider, [])[0] is False


def test_disabled_means_everyone_fetches_from_origin() -> None:
    svc = service(4, enabled=False)
    ds = digests(10)
    svc.set_versions({V1: ds})
    assert svc.placement(V1) == {d: [] for d in ds}
    assert svc.owners(ds[0]) == []
    assert svc.owned_by("edge-0") == set()
    assert svc.origin_allowed(ds[0], "edge-0", []) == (True, [])
    svc.enabled = True
    assert len(svc.owners(ds[0])) == 2
