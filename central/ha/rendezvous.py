"""Which replica owns a heartbeat partition: highest-random-weight (rendezvous) hashing.

Every replica computes the same owner from the same list of live replicas, with no
coordination. When a replica joins or leaves, only the partitions it wins or held move
(about 1/N of them), which keeps hand-overs, and so re-reads of node state, small."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def _weight(replica_id: str, partition: int) -> int:
    """A stable pseudo-random weight: the same on every replica, every Python, every run
    (``hash()`` is salted per process, so it cannot be used here)."""
    digest = hashlib.blake2b(f"{replica_id}/{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(partition: int, replica_ids: Sequence[str]) -> str:
    """The replica among ``replica_ids`` that owns ``partition``: the one with the highest weight
    (ties, practically impossible, go to the greater id so the answer never depends on order)."""
    if not replica_ids:
        raise ValueError("rendezvous_owner needs at least one replica")
    return max(replica_ids, key=lambda replica: (_weight(replica, partition), replica))


def partitions_of(replica_id: str, replica_ids: Iterable[str], partitions: int) -> set[int]:
    """The partitions in ``range(partitions)`` that ``replica_id`` owns among ``replica_ids``
    (itself included whether or not it is listed: a replica always counts itself as live)."""
    ids = sorted({*replica_ids, replica_id})
    return {k for k in range(partitions) if rendezvous_owner(k, ids) == replica_id}
