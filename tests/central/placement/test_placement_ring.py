"""Behaviour of the bounded-load consistent-hash placement function."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from central.placement import (
    RingMember,
    load_by_node,
    max_over_mean,
    moved_fraction,
    place,
)

REPO = Path(__file__).resolve().parents[3]


def digests(count: int, salt: str = "chunk") -> list[str]:
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(count)]


def ring(count: int, capacity: int = 1) -> list[RingMember]:
    return [RingMember(f"edge-{j:03d}", capacity) for j in range(count)]


def test_every_digest_gets_r_distinct_member_owners() -> None:
    members = ring(6)
    ids = {m.node_id for m in members}
    result = place(digests(60), members, replicas=3)
    assert len(result) == 60
    for owners in result.values():
        assert len(owners) == 3
        assert len(set(owners)) == 3
        assert set(owners) <= ids


def test_replicas_capped_by_membership_size() -> None:
    result = place(digests(10), ring(2), replicas=5)
    assert all(len(owners) == 2 and len(set(owners)) == 2 for owners in result.values())


def test_empty_membership_maps_to_no_owners() -> None:
    ds = digests(5)
    assert place(ds, []) == {d: [] for d in ds}
    assert place([], ring(3)) == {}


def test_duplicates_count_once_and_keys_keep_first_appearance_order() -> None:
    a, b, c = digests(3)
    result = place([b, a, b, c, a], ring(4))
    assert list(result) == [b, a, c]
    assert sum(load_by_node(result).values()) == 3 * 2


def test_deterministic_and_independent_of_member_order() -> None:
    ds = digests(200)
    members = ring(10)
    shuffled = list(members)
    random.Random(7).shuffle(shuffled)
    assert place(ds, members) == place(ds, shuffled) == place(list(reversed(ds)), members)


def test_independent_of_python_hash_seed() -> None:
    code = (
        "import hashlib, json; from central.placement import RingMember, place;"
        "ds=[hashlib.sha256(f'c-{i}'.encode()).hexdigest() for i in range(50)];"
        "print(json.dumps(place(ds, [RingMember(f'n{j}') for j in range(5)])))"
    )
    outputs = set()
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.add(proc.stdout)
    assert len(outputs) == 1
    assert json.loads(outputs.pop())


def test_capacity_weights_shift_load_roughly_proportionally() -> None:
    members = [RingMember(f"n{w}", w) for w in (1, 2, 3, 4)]
    result = place(digests(1000), members)
    loads = load_by_node(result)
    slots = sum(loads.values())
    shares = [loads[m.node_id] / (slots * m.capacity / 10) for m in members]
    assert all(0.6 <= share <= 1.26 for share in shares), shares
    assert [loads[m.node_id] for m in members] == sorted(loads.values())
    assert max_over_mean(result, members) == pytest.approx(max(shares))


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_cap_never_exceeded_with_equal_weights(replicas: int) -> None:
    for nodes in range(1, 13):
        for count in (1, 2, 3, 5, 8, 13, 40, 97):
            r = min(replicas, nodes)
            cap = min(count, math.ceil(1.25 * count * r / nodes))
            result = place(digests(count, f"s{nodes}"), ring(nodes), replicas=replicas)
            assert max(load_by_node(result).values()) <= cap, (nodes, count, replicas)


def test_unbounded_load_factor_is_plain_consistent_hashing() -> None:
    ds, members = digests(64), ring(8)
    bounded = place(ds, members)
    unbounded = place(ds, members, load_factor=math.inf)
    assert all(len(owners) == 2 for owners in unbounded.values())
    assert max_over_mean(unbounded, members) >= max_over_mean(bounded, members)


def test_extreme_skew_falls_back_to_distinct_least_loaded_nodes() -> None:
    members = [RingMember("big", 100), RingMember("a"), RingMember("b")]
    result = place(digests(50), members, replicas=2)
    for owners in result.values():
        assert len(owners) == 2 and len(set(owners)) == 2
    assert load_by_node(result)["big"] == 50


def test_leave_moves_only_the_leavers_pairs_and_keeps_survivor_order() -> None:
    ds, members = digests(400), ring(10)
    before = place(ds, members)
    leaver = "edge-004"
    after = place(ds, [m for m in members if m.node_id != leaver], previous=before)
    old_pairs = {(d, o) for d, owners in before.items() for o in owners}
    new_pairs = {(d, o) for d, owners in after.items() for o in owners}
    held = {(d, o) for d, o in old_pairs if o == leaver}
    assert len(new_pairs - old_pairs) == len(held)
    assert old_pairs - new_pairs == held
    assert moved_fraction(before, after) == pytest.approx(len(held) / len(new_pairs))
    for d, owners in before.items():
        survivors = [o for o in owners if o != leaver]
        assert after[d][: len(survivors)] == survivors
        assert len(after[d]) == 2 and leaver not in after[d]


def test_previous_only_applies_to_known_digests() -> None:
    ds, members = digests(30), ring(5)
    canonical = place(ds, members)
    partial = {d: canonical[d] for d in ds[:10]}
    assert place(ds, members, previous=partial) == canonical


def test_helpers_on_small_examples() -> None:
    old = {"d1": ["a", "b"], "d2": ["b", "c"]}
    new = {"d1": ["b", "a"], "d2": ["b", "d"]}
    assert moved_fraction(old, new) == pytest.approx(0.25)
    assert moved_fraction({}, {}) == 0.0
    assert load_by_node(new) == {"a": 1, "b": 2, "d": 1}
    members = [RingMember(n) for n in "abcd"]
    assert max_over_mean(new, members) == pytest.approx(2 / 1.0)
    assert max_over_mean({}, members) == 0.0


@pytest.mark.parametrize("kwargs", [{"replicas": 0}, {"load_factor": 0.9}, {"load_factor": float("nan")}])
def test_invalid_parameters_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        place(digests(3), ring(3), **kwargs)  # type: ignore[arg-type]


def test_invalid_members_rejected() -> None:
    with pytest.raises(ValueError):
        RingMember("n", 0)
    with pytest.raises(ValueError):
        RingMember("")
    with pytest.raises(ValueError):
        place(digests(3), [RingMember("n"), RingMember("n", 2)])
