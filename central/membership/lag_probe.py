"""How far behind its own MQTT feed central is, measured with nothing but its own clock.

Every ``every_s`` central publishes a sequence number to a topic only it subscribes to.
The probe travels the same broker queue and the same socket as the heartbeats, so the
time it takes to come back is exactly how long a heartbeat sent now waits before the
tracker sees it. Between probes the age of the oldest one still outstanding is a lower
bound on that wait, and so is the time since the last probe came back, less one period
(a stalled loop sends no probes and reads none). Node clocks never
enter into it, so a node whose clock is off cannot make central look slow or fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LagProbe"]

#: A measured lag is trusted this long (the largest one in that time counts); afterwards
#: only outstanding probes count.
_MEASURED_TTL_S = 2.0


class LagProbe:
    """Sends probes while connected; ``lag()`` is central's current inbound lag in seconds."""

    def __init__(self, publish: Callable[[bytes], bool], *, every_s: float = 0.25) -> None:
        """``publish(payload)`` sends one probe (QoS 0) and says whether paho took it."""
        self._publish = publish
        self.every_s = every_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._outstanding: dict[int, float] = {}  # seq -> loop time sent, oldest first
        self._seq = 0
        self._measured = 0.0
        self._measured_at = float("-inf")
        self._returned_at = float("-inf")
        self.probes_sent = 0
        self.probes_returned = 0

    def connected(self, loop: asyncio.AbstractEventLoop) -> None:
        """The link is up (its subscription requested): start probing."""
        self._loop = loop
        self._outstanding.clear()
        self._returned_at = loop.time()
        self._cancel()
        self._send()

    def disconnected(self) -> None:
        """The link is down: nothing to measure (the tracker freezes timeouts anyway)."""
        self._cancel()
        self._outstanding.clear()
        self._measured, self._measured_at = 0.0, float("-inf")
        self._loop = None

    def handle(self, payload: bytes | bytearray) -> None:
        """A probe came back (in order: every older one outstanding was lost)."""
        loop = self._loop
        try:
            seq = int(payload)
        except ValueError:
            return
        sent = self._outstanding.pop(seq, None)
        if sent is None or loop is None:
            return
        for older in [s for s in self._outstanding if s < seq]:
            del self._outstanding[older]
        now = loop.time()
        round_trip = now - sent
        # Keep the largest round trip of the last _MEASURED_TTL_S: after a hung broker resumes,
        # the probes it held come back in one batch, the newest with a round trip near zero,
        # while heartbeats held in other sockets may still be on their way behind them.
        if round_trip >= self._measured or now - self._measured_at > _MEASURED_TTL_S:
            self._measured, self._measured_at = round_trip, now
        self._returned_at = now
        self.probes_returned += 1

    def lag(self) -> float:
        """Seconds of feed not read yet: the largest of the largest round trip measured in
        the last ``_MEASURED_TTL_S``, the age of the oldest probe still on its way, and how
        overdue the next one is."""
        loop = self._loop
        if loop is None:
            return 0.0
        now = loop.time()
        measured = self._measured if now - self._measured_at <= _MEASURED_TTL_S else 0.0
        oldest = next(iter(self._outstanding.values()), None)
        waiting = now - oldest if oldest is not None else 0.0
        overdue = now - self._returned_at - self.every_s
        return max(measured, waiting, overdue)

    def _send(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._seq += 1
        if self._publish(str(self._seq).encode()):
            self._outstanding[self._seq] = loop.time()
            self.probes_sent += 1
        self._timer = loop.call_later(self.every_s, self._send)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
