"""``TransferGovernor``: the byte-rate caps of one edge's chunk traffic, in force now.

Two token buckets: one for every chunk byte this node fetches (from peers and the origin
together, paced piece by piece as bytes arrive, so gRPC flow control slows the sender;
a ``ByteWindow`` keeps each call within its deadline), one for chunk bytes its Peer
service sends (paced per piece sent).

Inference comes first. While an inference request is in flight here, serving to peers
runs at ``busy_serve_bytes_per_s`` (when set) instead of the serve cap: an edge has few
cores (2 on the reference machine), and seeding costs CPU that ONNX Runtime would
otherwise have (reading and hashing chunks, gRPC framing and TLS). The serving path asks
``busy()`` before every piece and every ``RECHECK_S`` while a piece waits, so the switch
takes effect within one piece or 50 ms, both ways. Fetching is not slowed: a node fetches
what it needs to serve."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from edge_node.transfer.meter import RateMeter
from edge_node.transfer.rate_limiter import ByteRateLimiter
from edge_node.transfer.window import ByteWindow
from fleetwire.transfer import TransferCaps


def _in_force(caps: TransferCaps) -> TransferCaps:
    """Unset caps as 0 (no cap)."""
    return TransferCaps(caps.serve_bytes_per_s or 0, caps.fetch_bytes_per_s or 0, caps.busy_serve_bytes_per_s or 0)


class TransferGovernor:
    """Paces chunk bytes fetched and served; ``apply`` changes the caps live."""

    def __init__(self, caps: TransferCaps, busy: Callable[[], bool] = lambda: False) -> None:
        """``caps``: the caps to start with (unset: no cap); ``busy()``: whether inference
        requests are in flight here now."""
        self._busy = busy
        self._was_busy = False
        self.caps = _in_force(caps)
        self._fetch = ByteRateLimiter(self.caps.fetch_bytes_per_s or 0)
        self._fetch_window = ByteWindow(self.caps.fetch_bytes_per_s or 0)
        self._serve = ByteRateLimiter(self._serve_rate())
        self.fetched = RateMeter()
        self.served = RateMeter()
        #: Times serving switched to or from the busy cap.
        self.busy_switches = 0

    def apply(self, caps: TransferCaps) -> None:
        """Put ``caps`` in force now (unset ones: no cap), for waiting pieces too."""
        self.caps = _in_force(caps)
        self._fetch.set_rate(self.caps.fetch_bytes_per_s or 0)
        self._fetch_window.set_rate(self.caps.fetch_bytes_per_s or 0)
        self._serve.set_rate(self._serve_rate())

    def reserve_fetch(self, size: int) -> AbstractAsyncContextManager[None]:
        """Held around one chunk's call (see ``ByteWindow``)."""
        return self._fetch_window.reserve(size)

    async def pace_fetch(self, n: int) -> None:
        """``n`` chunk bytes arrived from a peer or the origin: wait for the fetch cap."""
        self.fetched.add(n)
        await self._fetch.acquire(n)

    async def pace_serve(self, n: int) -> None:
        """``n`` chunk bytes are about to go to a peer: wait for the serve cap in force."""
        self._sync_serve()
        await self._serve.acquire(n, recheck=self._sync_serve)
        self.served.add(n)

    @property
    def serving_busy(self) -> bool:
        """Whether serving runs at the busy cap now."""
        return self._was_busy

    def serve_cap_now(self) -> int:
        """The serve rate in force now (0: no cap)."""
        return self._serve.rate

    def _serve_rate(self) -> int:
        busy_cap = self.caps.busy_serve_bytes_per_s or 0
        if self._was_busy and busy_cap > 0:
            return busy_cap
        return self.caps.serve_bytes_per_s or 0

    def _sync_serve(self) -> None:
        busy = self._busy()
        if busy != self._was_busy:
            self._was_busy = busy
            self.busy_switches += 1
        self._serve.set_rate(self._serve_rate())

    def as_dict(self) -> dict[str, Any]:
        """Caps in force and measured rates, for ``/api/v1/status``."""
        return {
            "caps": self.caps.as_dict(),
            "serve_cap_now_bytes_per_s": self.serve_cap_now(),
            "serving_busy": self._was_busy,
            "busy_switches": self.busy_switches,
            "fetch_bytes_per_s": round(self.fetched.rate()),
            "serve_bytes_per_s": round(self.served.rate()),
            "bytes_fetched": self.fetched.total,
            "bytes_served": self.served.total,
        }
