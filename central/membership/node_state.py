"""The tracker's mutable record of one node, and the snapshot it gives out."""

from __future__ import annotations

import asyncio

from central.membership.liveness import NodeLiveness, NodeView
from fleetwire.mqtt.fast import AnyHeartbeat, cache_model, load_model, model_info

__all__ = ["NO_KEYS", "TrackedNode"]

#: No (model, version) pairs: the ready keys of a node that reports nothing ready.
NO_KEYS: frozenset[tuple[str, str]] = frozenset()


class TrackedNode:
    """Everything the tracker knows about one node. Only the tracker's loop touches it."""

    __slots__ = (
        "bdseq",
        "birth_ts",
        "dead_bdseq",
        "grpc_address",
        "heartbeat",
        "http_address",
        "interval_s",
        "last_heartbeat_at",
        "node_id",
        "ready_keys",
        "revive_from",
        "seen_at",
        "since",
        "state",
        "timer",
        "timer_at",
    )

    def __init__(self, node_id: str, bdseq: int, interval_s: float, now: float) -> None:
        self.node_id = node_id
        self.state = NodeLiveness.ALIVE
        self.since = now
        self.bdseq = bdseq
        #: bdseq of the session an offline status ended; None when it died by timeout.
        self.dead_bdseq: int | None = None
        #: (bdseq, seq) of the last heartbeat that arrived while the node was dead and did
        #: not bring it back by itself; the next one of that session in order does.
        self.revive_from: tuple[int, int] | None = None
        self.birth_ts = 0
        self.interval_s = interval_s
        #: Last sign of life (heartbeat or fresh birth), loop time.
        self.seen_at = now
        self.last_heartbeat_at: float | None = None
        self.heartbeat: AnyHeartbeat | None = None
        self.grpc_address = ""
        self.http_address = ""
        #: (model, version) pairs the last heartbeat reports ``ready``; mirrored in the index.
        self.ready_keys: frozenset[tuple[str, str]] = NO_KEYS
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    def record_heartbeat(self, hb: AnyHeartbeat, now: float) -> None:
        """Take ``hb`` as the latest heartbeat (``ready_keys`` is the index's to update)."""
        self.heartbeat = hb
        self.last_heartbeat_at = now
        self.seen_at = max(self.seen_at, now)  # ``now`` is lag-corrected: it may step back
        self.interval_s = hb.interval_s
        self.grpc_address = hb.grpc_address
        self.http_address = hb.http_address

    def view(self, now: float) -> NodeView:
        """A snapshot, ages counted to ``now`` (loop time)."""
        hb = self.heartbeat
        at = self.last_heartbeat_at
        return NodeView(
            node_id=self.node_id,
            state=self.state,
            last_heartbeat_at=at,
            last_heartbeat_age_s=None if at is None else max(0.0, now - at),
            bdseq=self.bdseq,
            interval_s=self.interval_s,
            grpc_address=self.grpc_address,
            http_address=self.http_address,
            models=[model_info(m) for m in hb.models] if hb is not None else [],
            load=load_model(hb.load) if hb is not None else None,
            reported_state=hb.state if hb is not None else None,
            state_since=self.since,
            cache=cache_model(hb.cache) if hb is not None else None,
            hardware_class=hb.hardware_class if hb is not None else "",
            mode=hb.mode if hb is not None else "",
            autonomous_since_ms=hb.autonomous_since if hb is not None else None,
            clock_offset_ms=hb.clock_offset_ms if hb is not None else None,
            clock_error_ms=hb.clock_error_ms if hb is not None else None,
        )
