"""Caps on the chunk streams this node serves to peers: a few per calling node (who its
client certificate says it is, ``edge_node.peer.identity.caller_of``) and a total. Each
open stream can hold a whole chunk (up to the chunking maximum) in memory and may start an
upstream fetch, so one peer opening streams without end could exhaust this node; beyond a
cap the stream is refused at once (RESOURCE_EXHAUSTED) and the requester tries another
owner or central."""

from __future__ import annotations

from collections import Counter


class StreamsExhausted(Exception):
    """No stream slot for this requester now; the message says which cap was hit."""


class StreamLimiter:
    """Counts open streams per requester and in total (one event loop: no locking)."""

    def __init__(self, per_requester: int, total: int) -> None:
        if per_requester < 1 or total < 1:
            raise ValueError("stream caps must be at least 1")
        self.per_requester = per_requester
        self.total = total
        self._open: Counter[str] = Counter()
        self._total_open = 0
        self.refused = 0

    @property
    def open_streams(self) -> int:
        """Streams being served right now."""
        return self._total_open

    def acquire(self, requester: str) -> None:
        """Take one stream slot for ``requester``, or StreamsExhausted when a cap is reached."""
        if self._open[requester] >= self.per_requester:
            self.refused += 1
            raise StreamsExhausted(
                f"caller {requester!r} already has {self.per_requester} chunk streams open here"
                " (limits.max_peer_streams_per_node); try another owner"
            )
        if self._total_open >= self.total:
            self.refused += 1
            raise StreamsExhausted(f"{self.total} chunk streams are open here (limits.max_peer_streams)")
        self._open[requester] += 1
        self._total_open += 1

    def release(self, requester: str) -> None:
        """Give back a slot taken by ``acquire``."""
        self._total_open -= 1
        self._open[requester] -= 1
        if self._open[requester] <= 0:
            del self._open[requester]
