"""Rendezvous hashing: every replica computes the same owners, the share is even, and a
replica joining takes partitions only for itself."""

from __future__ import annotations

from collections import Counter

import pytest

from central.ha.rendezvous import partitions_of, rendezvous_owner

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


def test_a_joining_replica_takes_partitions_only_for_itself() -> None:
    before = {k: rendezvous_owner(k, REPLICAS) for k in range(4096)}
    after = {k: rendezvous_owner(k, [*REPLICAS, "central-d"]) for k in range(4096)}
    moved = {k for k in before if before[k] != after[k]}
    assert moved and all(after[k] == "central-d" for k in moved)
    assert moved == partitions_of("central-d", REPLICAS, 4096)


def test_no_replicas_is_an_error() -> None:
    with pytest.raises(ValueError):
        rendezvous_owner(0, [])
