"""Replicated central (issue 13): the per-replica control session that elects one leader and
spreads heartbeat partitions over the live replicas, and the fencing checks that keep a stale
leader or partition owner from writing."""

from __future__ import annotations

from central.ha.control import ControlListener, ControlUnavailable, ReplicaControl, ReplicaInfo
from central.ha.fencing import Fenced, check_leader_epoch, check_partition_epoch
from central.ha.rendezvous import partitions_of, rendezvous_owner

__all__ = [
    "ControlListener",
    "ControlUnavailable",
    "Fenced",
    "ReplicaControl",
    "ReplicaInfo",
    "check_leader_epoch",
    "check_partition_epoch",
    "partitions_of",
    "rendezvous_owner",
]
