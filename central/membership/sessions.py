"""Sparkplug-style session rules: which birth, death or heartbeat belongs to a node's
current session (by ``bdseq`` and timestamp), and which ones are stale. Pure predicates on
a tracked node's record; the tracker acts on their answers."""

from __future__ import annotations

from enum import Enum

from central.membership.liveness import REASON_CLEAN, REASON_WILL
from central.membership.node_state import TrackedNode
from fleetwire.mqtt.fast import AnyHeartbeat
from fleetwire.mqtt.payloads import NodeStatus

__all__ = ["Birth", "classify_birth", "death_is_stale", "death_reason", "heartbeat_is_stale"]


class Birth(Enum):
    """What an ``online`` status means for a node already tracked."""

    #: The same birth again (retained redelivery on resubscribe, QoS 1 duplicate):
    #: not a fresh sign of life.
    REPEAT = "repeat"
    #: A smaller bdseq stamped no later than the current birth: an old session's birth.
    STALE = "stale"
    #: A later birth with a smaller bdseq: the node restarted with its counter reset.
    RESET = "reset"
    #: The next session.
    NEW = "new"


def classify_birth(node: TrackedNode, status: NodeStatus) -> Birth:
    """How the birth ``status`` relates to ``node``'s current session."""
    if status.bdseq == node.bdseq:
        return Birth.REPEAT
    if status.bdseq < node.bdseq:
        return Birth.STALE if status.ts <= node.birth_ts else Birth.RESET
    return Birth.NEW


def heartbeat_is_stale(node: TrackedNode, hb: AnyHeartbeat) -> bool:
    """From a session that has been superseded or has ended with an offline status."""
    return hb.bdseq < node.bdseq or (node.dead_bdseq is not None and hb.bdseq <= node.dead_bdseq)


def death_is_stale(node: TrackedNode, status: NodeStatus) -> bool:
    """The Last Will of a superseded session; or, after a bdseq reset, the will of the
    session before the reset (a larger bdseq, stamped before the current birth)."""
    return status.bdseq < node.bdseq or (status.bdseq > node.bdseq and status.ts < node.birth_ts)


def death_reason(node: TrackedNode, status: NodeStatus) -> str:
    """Last will or clean shutdown. A Last Will is composed at connect time, so it is
    stamped no later than the birth and the heartbeats of its session; a clean offline is
    stamped at shutdown."""
    last_ts = max(node.birth_ts, node.heartbeat.ts if node.heartbeat is not None else 0)
    return REASON_WILL if status.ts <= last_ts else REASON_CLEAN
