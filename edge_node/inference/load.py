"""``LoadTracker``: what the edge is doing right now, as a heartbeat's ``LoadInfo``.

The serving path feeds it (``begin``/``end``, or ``track()`` around a request, plus
``queued``/``dequeued`` for work waiting in a batcher); the heartbeat reads it once per
interval with ``snapshot()``. Thread-safe: requests may finish on worker threads.

* ``inflight``: requests begun and not yet ended.
* ``queue_depth``: what ``queued``/``dequeued`` (or ``set_queue_depth``) say.
* ``rps``: requests ended since the previous snapshot, per second of wall time.
* ``p50_ms``/``p99_ms``: of the last ``window`` latencies from the last ``max_age_s``.
* ``cpu_percent``: this process's CPU time (``time.process_time``, every thread)
  since the previous snapshot, per wall time; 100 is one core, so it may exceed 100.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fleetwire.mqtt.payloads import LoadInfo


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0..100) of already sorted values; 0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LoadTracker:
    """Counts requests and latencies; ``snapshot()`` turns them into a ``LoadInfo``."""

    def __init__(
        self,
        window: int = 1024,
        max_age_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._lock = threading.Lock()
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._max_age_s = max_age_s
        self._latencies: deque[tuple[float, float]] = deque(maxlen=window)  # (ended at, seconds)
        self._inflight = 0
        self._queue_depth = 0
        self._completed = 0
        self._last_wall = clock()
        self._last_cpu = cpu_clock()
        self._last_completed = 0
        self.total_requests = 0

    # -- feeding -----------------------------------------------------------------------

    def begin(self) -> float:
        """A request starts; returns its start time, for ``end``."""
        with self._lock:
            self._inflight += 1
            self.total_requests += 1
        return self._clock()

    def end(self, started: float, record_latency: bool = True) -> float:
        """The request begun at ``started`` is over; returns its latency in seconds.

        ``record_latency=False`` counts it (rps) without its latency (e.g. rejected)."""
        now = self._clock()
        latency = max(0.0, now - started)
        with self._lock:
            self._inflight = max(0, self._inflight - 1)
            self._completed += 1
            if record_latency:
                self._latencies.append((now, latency))
        return latency

    @contextmanager
    def track(self) -> Iterator[None]:
        """``with tracker.track(): ...`` around one request."""
        started = self.begin()
        try:
            yield
        finally:
            self.end(started)

    def observe(self, latency_s: float) -> None:
        """Record one finished request measured elsewhere (no inflight bookkeeping)."""
        with self._lock:
            self._completed += 1
            self.total_requests += 1
            self._latencies.append((self._clock(), max(0.0, latency_s)))

    def queued(self, n: int = 1) -> None:
        """``n`` items started waiting (e.g. in a batch queue)."""
        with self._lock:
            self._queue_depth += n

    def dequeued(self, n: int = 1) -> None:
        """``n`` waiting items left the queue."""
        with self._lock:
            self._queue_depth = max(0, self._queue_depth - n)

    def set_queue_depth(self, depth: int) -> None:
        """Overwrite the queue depth (when the queue itself knows it)."""
        with self._lock:
            self._queue_depth = max(0, depth)

    # -- reading -----------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        """Requests running now."""
        with self._lock:
            return self._inflight

    def snapshot(self) -> LoadInfo:
        """The load since the previous snapshot (rps, cpu) and of recent requests (p50/p99)."""
        now = self._clock()
        cpu = self._cpu_clock()
        with self._lock:
            elapsed = now - self._last_wall
            done = self._completed - self._last_completed
            cpu_used = cpu - self._last_cpu
            self._last_wall, self._last_cpu, self._last_completed = now, cpu, self._completed
            horizon = now - self._max_age_s
            while self._latencies and self._latencies[0][0] < horizon:
                self._latencies.popleft()
            recent = sorted(latency for _, latency in self._latencies)
            inflight, depth = self._inflight, self._queue_depth
        rps = done / elapsed if elapsed > 0 else 0.0
        cpu_percent = max(0.0, 100.0 * cpu_used / elapsed) if elapsed > 0 else 0.0
        return LoadInfo(
            inflight=inflight,
            queue_depth=depth,
            cpu_percent=round(cpu_percent, 2),
            rps=round(rps, 3),
            p50_ms=round(percentile(recent, 50) * 1000.0, 3),
            p99_ms=round(percentile(recent, 99) * 1000.0, 3),
        )
