"""Fencing tokens: a write made on behalf of the leader, or of a partition's owner, checks
inside its own transaction that the epoch it was granted is still the current one.

Advisory locks alone cannot stop a stale writer: a replica whose control session PostgreSQL
has already closed (network cut, a pause longer than the TTL) still believes it leads until
its next tick. The new owner bumps the epoch when it takes over; ``FOR SHARE`` makes that
bump wait for writes already under way, and every later write by the old owner sees the new
epoch and fails with :class:`Fenced` instead of overwriting the new owner's state."""

from __future__ import annotations

import psycopg

from central.errors import CentralError

_LEADER_EPOCH = "SELECT epoch FROM ha_leader WHERE id = 1 FOR SHARE"
_PARTITION_EPOCH = "SELECT epoch FROM ha_partitions WHERE partition = %s FOR SHARE"


class Fenced(CentralError):
    """A write by a replica that is no longer the leader, or no longer owns the partition:
    nothing was written. Clients may retry; another replica now answers for it."""

    http_status = 503
    rpc_status = "UNAVAILABLE"


def check_leader_epoch(conn: psycopg.Connection, epoch: int) -> None:
    """Raise :class:`Fenced` unless ``epoch`` is the current leader epoch. Call it inside the
    transaction that writes: the row stays share-locked until that transaction ends."""
    row = conn.execute(_LEADER_EPOCH).fetchone()
    current = None if row is None else int(row[0])
    if current != epoch:
        raise Fenced(f"leader epoch {epoch} is stale (current: {current}); this replica no longer leads")


def check_partition_epoch(conn: psycopg.Connection, partition: int, epoch: int) -> None:
    """Raise :class:`Fenced` unless ``epoch`` is ``partition``'s current owner epoch; like
    :func:`check_leader_epoch`, inside the writing transaction."""
    row = conn.execute(_PARTITION_EPOCH, (partition,)).fetchone()
    current = None if row is None else int(row[0])
    if current != epoch:
        raise Fenced(
            f"partition {partition} epoch {epoch} is stale (current: {current}); this replica no longer owns it"
        )
