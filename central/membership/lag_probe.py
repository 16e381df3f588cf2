"""How far behind its own MQTT feed central is, measured with nothing but its own clock.

Every ``every_s`` central publishes a sequence number to a topic only it subscribes to.
The probe travels the same broker queue and the same socket as the heartbeats, so the
time it takes to come back is exactly how long a heartbeat sent now waits before the
tracker sees it. Between probes the age of the oldest one still outstanding is a lower
bound on that wait, and so is the time since the last probe came back, less one period
(a stalled loop sends no probes and reads none). Node clocks never
enter into it, so a node whose clock is off cannot make central look slow or fast.

The lag never drops at once: when a probe comes back, the lag known just before (the
largest of its parts) becomes a floor that falls at ``DECAY_PER_S``. The tracker credits
a heartbeat read while central lags as sent "now minus the lag"; if the lag then fell to
nothing in one step (the last probe of a batch a hung broker returns at once has a round
trip near zero; a probe sent after central itself was frozen comes back right behind the
backlog), every node whose next heartbeat is still on its way would look silent for the
whole drop and be convicted (bug B5 in docs/reliability.md). Falling at a quarter of
real time, what central has heard runs ahead of a live node's credited heartbeat by at
most 1.25 of its intervals before the next one is read, which leaves room under
``suspect_after`` (2) for a late heartbeat. A real death after a hang of L seconds is
judged up to about 4 × L later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LagProbe"]

#: How fast the lag known when a probe returns may fall afterwards (seconds per second).
DECAY_PER_S = 0.25


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
        self._floor = 0.0  # the lag when the last probe returned, falling at DECAY_PER_S from _floor_at
        self._floor_at = float("-inf")
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
        self._floor, self._floor_at = 0.0, float("-inf")
        self._loop = None

    def handle(self, payload: bytes | bytearray) -> None:
        """A probe came back (in order: every older one outstanding was lost)."""
        loop = self._loop
        try:
            seq = int(payload)
        except ValueError:
            return
        if loop is None or seq not in self._outstanding:
            return
        before = self.lag()  # the floor starts where the lag was: it never drops at once
        sent = self._outstanding.pop(seq)
        for older in [s for s in self._outstanding if s < seq]:
            del self._outstanding[older]
        now = loop.time()
        self._floor, self._floor_at = max(before, now - sent), now
        self._returned_at = now
        self.probes_returned += 1

    def lag(self) -> float:
        """Seconds of feed not read yet: the largest of the floor left by the last returned
        probe (falling at ``DECAY_PER_S``), the age of the oldest probe still on its way, and
        how overdue the next one is."""
        loop = self._loop
        if loop is None:
            return 0.0
        now = loop.time()
        floor = self._floor - DECAY_PER_S * (now - self._floor_at)
        oldest = next(iter(self._outstanding.values()), None)
        waiting = now - oldest if oldest is not None else 0.0
        overdue = now - self._returned_at - self.every_s
        return max(floor, waiting, overdue, 0.0)

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
