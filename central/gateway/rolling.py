"""Rolling request rate and latency of the gateway, one bucket per wall-clock second.

The counters in ``GatewayStats`` only grow; a dashboard wants "requests per second and
p50/p99 right now" and a minute of history to draw. Buckets are kept for ``window_s``
seconds; each keeps at most ``samples_per_bucket`` latencies (the first ones of that
second), which bounds memory under any load while leaving the percentiles of a busy
second representative enough for a chart."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RollingStats"]


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


@dataclass
class _Bucket:
    second: int
    requests: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)


class RollingStats:
    """Requests, errors and latencies of the last ``window_s`` seconds, per second."""

    def __init__(
        self, window_s: int = 60, samples_per_bucket: int = 2000, clock: Callable[[], float] = time.time
    ) -> None:
        if window_s < 1 or samples_per_bucket < 1:
            raise ValueError("window_s and samples_per_bucket must be >= 1")
        self.window_s = window_s
        self.samples_per_bucket = samples_per_bucket
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()

    def record(self, latency_s: float, ok: bool) -> None:
        """One request answered after ``latency_s``; ``ok`` False for a 5xx (or 503 of its own)."""
        second = int(self._clock())
        if not self._buckets or self._buckets[-1].second != second:
            self._buckets.append(_Bucket(second))
            self._expire(second)
        bucket = self._buckets[-1]
        bucket.requests += 1
        if not ok:
            bucket.errors += 1
        if len(bucket.latencies_s) < self.samples_per_bucket:
            bucket.latencies_s.append(latency_s)

    def _expire(self, now_second: int) -> None:
        while self._buckets and self._buckets[0].second <= now_second - self.window_s:
            self._buckets.popleft()

    def series(self) -> list[dict[str, Any]]:
        """One point per second of the window, oldest first; seconds without requests are zeros.
        The current (incomplete) second is left out so the last point never dips."""
        now = int(self._clock())
        self._expire(now)
        by_second = {b.second: b for b in self._buckets}
        points = []
        for second in range(now - self.window_s + 1, now):
            b = by_second.get(second)
            lat = sorted(b.latencies_s) if b else []
            points.append(
                {
                    "t": second,
                    "requests": b.requests if b else 0,
                    "errors": b.errors if b else 0,
                    "p50_ms": round(_percentile(lat, 0.50) * 1000, 3),
                    "p99_ms": round(_percentile(lat, 0.99) * 1000, 3),
                }
            )
        return points

    def summary(self, last_s: int = 10) -> dict[str, Any]:
        """Rate and percentiles over the last ``last_s`` complete seconds."""
        now = int(self._clock())
        recent = [b for b in self._buckets if now - last_s <= b.second < now]
        lat = sorted(x for b in recent for x in b.latencies_s)
        requests = sum(b.requests for b in recent)
        return {
            "rps": round(requests / last_s, 3),
            "errors": sum(b.errors for b in recent),
            "p50_ms": round(_percentile(lat, 0.50) * 1000, 3),
            "p99_ms": round(_percentile(lat, 0.99) * 1000, 3),
        }
