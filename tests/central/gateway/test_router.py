"""Candidate ordering: least outstanding with rotating ties, affinity, breakers."""

from __future__ import annotations

from collections import Counter

import pytest

from central.gateway.candidates import Candidate, NodeSource, StaticNodeSource
from central.gateway.router import GatewayRouter

NODES = [Candidate(f"n{i}", f"127.0.0.1:{9000 + i}") for i in range(3)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ids(cands: list[Candidate]) -> list[str]:
    return [c.node_id for c in cands]


def test_static_source_and_overrides() -> None:
    source = StaticNodeSource(NODES)
    assert isinstance(source, NodeSource)
    assert source.candidates("m", None) == NODES
    source.set_model("other", NODES[:1])
    assert source.candidates("other", "1") == NODES[:1]
    source.set_model("gone", [])
    assert source.candidates("gone", None) == []
    source.set_model("other", None)
    source.set(NODES[1:])
    assert source.candidates("other", None) == NODES[1:]


def test_least_outstanding_first() -> None:
    router = GatewayRouter(StaticNodeSource(NODES))
    router.acquire("n0")
    router.acquire("n0")
    router.acquire("n1")
    for _ in range(5):
        assert _ids(router.order("m", None)) == ["n2", "n1", "n0"]
    router.release("n0")
    router.release("n0")
    router.release("n1")
    assert router.outstanding("n0") == 0 and router.snapshot()["nodes"] == [
        {"node_id": i, "outstanding": 0, "breaker": router.breaker(i).snapshot()} for i in ("n0", "n1", "n2")
    ]


def test_ties_rotate_so_load_spreads() -> None:
    router = GatewayRouter(StaticNodeSource(NODES))
    firsts = Counter(router.order("m", None)[0].node_id for _ in range(300))
    assert firsts == {"n0": 100, "n1": 100, "n2": 100}
    orders = {tuple(_ids(router.order("m", None))) for _ in range(3)}
    assert all(len(set(o)) == 3 for o in orders)


def test_duplicate_ids_are_ignored() -> None:
    router = GatewayRouter(StaticNodeSource([*NODES, Candidate("n0", "elsewhere:1")]))
    ordered = router.order("m", None)
    assert sorted(_ids(ordered)) == ["n0", "n1", "n2"]
    assert next(c for c in ordered if c.node_id == "n0").http_address == "127.0.0.1:9000"


def test_affinity_key_pins_owner_first_and_rest_by_load() -> None:
    router = GatewayRouter(StaticNodeSource(NODES))
    owners = {}
    for key in (f"user-{i}" for i in range(50)):
        got = {router.order("m", None, key)[0].node_id for _ in range(10)}
        assert len(got) == 1, key
        owners[key] = got.pop()
        assert owners[key] == router.owner("m", None, key)
    assert set(owners.values()) == {"n0", "n1", "n2"}  # keys spread over the ring
    key = next(k for k, o in owners.items() if o == "n0")
    for _ in range(3):
        router.acquire("n0")
    router.acquire("n1")
    assert _ids(router.order("m", None, key)) == ["n0", "n2", "n1"]  # owner even when busiest


def test_affinity_moves_only_the_failed_nodes_keys() -> None:
    clock = Clock()
    router = GatewayRouter(StaticNodeSource(NODES), failure_threshold=1, open_s=5.0, clock=clock)
    keys = [f"k{i}" for i in range(200)]
    before = {k: router.order("m", None, k)[0].node_id for k in keys}
    router.breaker("n1").record_failure()
    during = {k: router.order("m", None, k)[0].node_id for k in keys}
    assert "n1" not in during.values()
    assert all(during[k] == before[k] for k in keys if before[k] != "n1")
    clock.now += 5.0
    router.breaker("n1").allow()
    router.breaker("n1").record_success()
    assert {k: router.order("m", None, k)[0].node_id for k in keys} == before


def test_affinity_policy_hashes_by_model_without_a_key() -> None:
    router = GatewayRouter(StaticNodeSource(NODES), policy="affinity")
    for model in ("a", "b", "c", "d"):
        firsts = {router.order(model, None)[0].node_id for _ in range(6)}
        assert firsts == {router.owner(model, None, model)}
    assert router.order("a", "2")[0].node_id == router.owner("a", "2", "a:2")


def test_open_breakers_are_skipped_half_open_returns() -> None:
    clock = Clock()
    router = GatewayRouter(StaticNodeSource(NODES), failure_threshold=2, open_s=1.0, clock=clock)
    router.breaker("n0").record_failure()
    router.breaker("n0").record_failure()
    for _ in range(6):
        assert "n0" not in _ids(router.order("m", None))
    clock.now += 1.0
    assert "n0" in _ids(router.order("m", None))
    assert router.breaker("n0").allow()  # someone takes the trial
    assert "n0" not in _ids(router.order("m", None))


def test_no_candidates() -> None:
    router = GatewayRouter(StaticNodeSource([]))
    assert router.order("m", None) == [] and router.order("m", None, "key") == []
    assert router.owner("m", None, "key") is None
    with pytest.raises(ValueError, match="routing policy"):
        GatewayRouter(StaticNodeSource([]), policy="random")  # type: ignore[arg-type]
