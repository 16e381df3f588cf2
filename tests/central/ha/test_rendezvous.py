"""Rendezvous hashing with bounded loads: every replica computes the same owners, no replica
holds more than its capped share, and a join moves little besides what the joiner takes."""

from __future__ import annotations

from collections import Counter

import pytest

from central.ha.rendezvous import LOAD_SLACK, assignment, partitions_of, rendezvous_owner

REPLICAS = ["central-a", "central-b", "central-c"]


def test_the_owner_does_not_depend_on_order_or_process() -> None:
    owners = [rendezvous_owner(k, REPLICAS) for k in range(64)]
    assert owners == [rendezvous_owner(k, list(reversed(REPLICAS))) for k in range(64)]
    # Pinned: a hash that changed between releases would move every partition at an upgrade.
    assert [rendezvous_owner(k, ["x", "y"]) for k in range(8)] == ["x", "x", "y", "y", "y", "x", "x", "y"]


def test_4096_partitions_spread_evenly_over_3_replicas() -> None:
    counts = Counter(rendezvous_owner(k, REPLICAS) for k in range(4096))
    mean = 4096 / 3
    assert set(counts) == set(REPLICAS)
    assert all(abs(n - mean) <= 0.15 * mean for n in counts.values()), counts


@pytest.mark.parametrize("ids", [REPLICAS, ["central-1", "central-2", "central-3"], list("abcde"), ["r0", "r1"]])
def test_no_replica_holds_more_than_its_capped_share(ids: list[str]) -> None:
    for partitions in (16, 64, 1000):
        counts = Counter(assignment(tuple(ids), partitions).values())
        assert sum(counts.values()) == partitions
        assert max(counts.values()) <= (1 + LOAD_SLACK) * partitions / len(ids) + 1, (partitions, counts)
    # Plain rendezvous would give central-1..3 a share of 14/28/22 of 64 (1.31 × the mean).
    assert Counter(rendezvous_owner(k, ["central-1", "central-2", "central-3"]) for k in range(64))["central-2"] == 28


def test_a_joining_replica_moves_little_besides_what_it_takes() -> None:
    before = assignment(tuple(REPLICAS), 4096)
    after = assignment((*REPLICAS, "central-d"), 4096)
    taken = {k for k in after if after[k] == "central-d"}
    shuffled = {k for k in after if before[k] != after[k] and k not in taken}
    assert len(taken) >= 4096 / 4 * 0.9
    assert len(shuffled) <= 0.1 * 4096, "a capped share costs few extra moves"
    assert taken == partitions_of("central-d", REPLICAS, 4096)


def test_no_replicas_is_an_error() -> None:
    with pytest.raises(ValueError):
        rendezvous_owner(0, [])
