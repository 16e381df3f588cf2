"""How far this node's wall clock is from central's, measured NTP-style over the registry link.

A staged rollout flips every node at one instant of central's clock (``serve_at_ms``); a node
whose clock is off by a second would switch a second early or late. So the edge asks central
for its time a few times (``Registry.Clock``), keeps the sample with the shortest round trip
(the least room for queueing to skew it), and takes ``offset = central − (sent + received) / 2``
with an error bound of half that round trip: the true offset lies within it whatever the split
of the trip. The offset goes into every heartbeat, so central can refuse a flip to a node whose
offset is unknown or too uncertain, and the edge uses it to turn central's instant into its own.

Measured at every (re)connection and every ``interval_s`` after; a failed round keeps the last
estimate (a clock drifts by milliseconds a minute at worst)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from fleetwire.v1 import registry_pb2

log = logging.getLogger(__name__)

__all__ = ["ClockEstimate", "ClockProbe"]

Ask = Callable[[], Awaitable[registry_pb2.ClockReply]]


@dataclass(frozen=True)
class ClockEstimate:
    """Central's clock minus this node's, and the bound on that figure's error."""

    offset_s: float
    error_s: float
    measured_at: float

    def central_to_local(self, central_s: float) -> float:
        """The instant of this node's clock that is ``central_s`` on central's."""
        return central_s - self.offset_s


class ClockProbe:
    """Keeps an estimate of central's clock offset; ``run`` measures it while a link is up."""

    def __init__(self, samples: int = 5, interval_s: float = 60.0, timeout_s: float = 2.0) -> None:
        self.samples = samples
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        #: The latest estimate (None: never measured).
        self.estimate: ClockEstimate | None = None

    async def measure(self, ask: Ask) -> ClockEstimate | None:
        """One round of ``samples`` calls; the best sample becomes the estimate (None: all failed)."""
        best: tuple[float, float] | None = None  # (round trip, offset)
        for _ in range(self.samples):
            sent = time.time()
            try:
                reply = await asyncio.wait_for(ask(), self.timeout_s)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                log.debug("clock sample failed: %s", exc)
                continue
            received = time.time()
            rtt = max(0.0, received - sent)
            offset = reply.now_us / 1e6 - (sent + received) / 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        if best is None:
            return None
        estimate = ClockEstimate(offset_s=best[1], error_s=best[0] / 2, measured_at=time.time())
        if self.estimate is None or abs(estimate.offset_s - self.estimate.offset_s) > 0.05:
            log.info("central's clock is %+.3f s from this node's (± %.3f s)", estimate.offset_s, estimate.error_s)
        self.estimate = estimate
        return estimate

    async def run(self, ask: Ask) -> None:
        """Measure now and every ``interval_s`` until cancelled (the link's lifetime)."""
        while True:
            await self.measure(ask)
            await asyncio.sleep(self.interval_s)

    def to_local(self, central_s: float) -> float:
        """``central_s`` on this node's clock (as is while the offset is unknown)."""
        return central_s if self.estimate is None else self.estimate.central_to_local(central_s)

    def heartbeat_fields(self) -> tuple[float | None, float | None]:
        """``(clock_offset_ms, clock_error_ms)`` for a heartbeat; None while unknown."""
        if self.estimate is None:
            return None, None
        return round(self.estimate.offset_s * 1000, 3), round(self.estimate.error_s * 1000, 3)
