"""Sparkplug-style session rules: which birth, death or heartbeat belongs to a node's
current session (by ``bdseq`` and timestamp), and which ones are stale. Pure predicates on
a tracked node's record; the tracker acts on their answers.

Anyone who may publish on a node's topics (an anonymous client on a broker without the
ACL, an edge sharing a login) can send a status for it, with any ``bdseq`` and any ``ts``;
the rules are chosen so that such a message never wins for good over the node's own
stream:

- a death counts only when its ``bdseq`` is the one of the node's current session (its
  Last Will and its clean offline carry that number); it never moves the session on, so
  an ``offline`` with a huge ``bdseq`` is ignored;
- while the node is alive or suspect, a birth or heartbeat may move its session ahead by
  at most ``MAX_BDSEQ_AHEAD``; once it is dead, by any amount (an edge that restarted
  many times without reaching the broker);
- a dead node's own heartbeats bring it back: at once when they open a later session (or
  continue the one that only timed out), else as soon as two of the same session arrive
  in order after the death. No heartbeat of a session follows that session's real death
  (the broker sends the will after the connection is gone, a clean stop stops beating
  first), so a stream that goes on says the death was not the node's own.
"""

from __future__ import annotations

from enum import Enum

from central.membership.liveness import REASON_CLEAN, REASON_WILL, NodeLiveness
from central.membership.node_state import TrackedNode
from fleetwire.mqtt.fast import AnyHeartbeat
from fleetwire.mqtt.payloads import NodeStatus

__all__ = [
    "MAX_BDSEQ_AHEAD",
    "Birth",
    "classify_birth",
    "death_ends_session",
    "death_reason",
    "heartbeat_is_stale",
    "opens_later_session",
    "revives_after_death",
    "too_far_ahead",
]

#: How far one birth or heartbeat may move a live node's ``bdseq`` ahead. An edge takes
#: one number per connection and per start, so between two sessions central sees it
#: moves by one, or by the starts that never reached the broker; those take long enough
#: that central has declared the node dead meanwhile, and then no bound applies.
MAX_BDSEQ_AHEAD = 1000


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
    #: Further ahead of a live node's session than any restart gets: ignored.
    AHEAD = "ahead"


def too_far_ahead(node: TrackedNode, bdseq: int) -> bool:
    """``bdseq`` would move a node that is still alive or suspect implausibly far ahead."""
    return bdseq - node.bdseq > MAX_BDSEQ_AHEAD and node.state is not NodeLiveness.DEAD


def classify_birth(node: TrackedNode, status: NodeStatus) -> Birth:
    """How the birth ``status`` relates to ``node``'s current session."""
    if status.bdseq == node.bdseq:
        return Birth.REPEAT
    if status.bdseq < node.bdseq:
        return Birth.STALE if status.ts <= node.birth_ts else Birth.RESET
    return Birth.AHEAD if too_far_ahead(node, status.bdseq) else Birth.NEW


def heartbeat_is_stale(node: TrackedNode, hb: AnyHeartbeat) -> bool:
    """For a node that is alive or suspect: from a session that has been superseded."""
    return hb.bdseq < node.bdseq


def opens_later_session(node: TrackedNode, hb: AnyHeartbeat) -> bool:
    """For a dead node: ``hb`` comes from a session after the one that ended, or from the
    session that was only timed out (never ended by an offline)."""
    return hb.bdseq > node.bdseq or (hb.bdseq == node.bdseq and node.dead_bdseq is None)


def revives_after_death(node: TrackedNode, hb: AnyHeartbeat) -> bool:
    """For a dead node: ``hb`` follows, in order, another heartbeat of its session that
    arrived after the death (``node.revive_from``)."""
    first = node.revive_from
    return first is not None and first[0] == hb.bdseq and hb.seq > first[1]


def death_ends_session(node: TrackedNode, status: NodeStatus) -> bool:
    """The offline ``status`` is the death of the node's current session. Any other one is
    a superseded session's will, the will of the session before a bdseq reset, or not the
    node's own: it is ignored, and never moves the session on."""
    return status.bdseq == node.bdseq


def death_reason(node: TrackedNode, status: NodeStatus) -> str:
    """Last will or clean shutdown. A Last Will is composed at connect time, so it is
    stamped no later than the birth and the heartbeats of its session; a clean offline is
    stamped at shutdown."""
    last_ts = max(node.birth_ts, node.heartbeat.ts if node.heartbeat is not None else 0)
    return REASON_WILL if status.ts <= last_ts else REASON_CLEAN
