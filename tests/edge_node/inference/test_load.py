"""LoadTracker: the load figures a heartbeat carries (in flight, rate, latency, CPU)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from edge_node.inference import LoadTracker, percentile


def test_load_tracker_reports_inflight_rps_latency_and_cpu() -> None:
    clock = SimpleNamespace(wall=100.0, cpu=10.0)
    tracker = LoadTracker(clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu, max_age_s=30)
    for i in range(100):
        started = tracker.begin()
        clock.wall += (i + 1) / 1000.0  # latencies 1..100 ms
        tracker.end(started)
    a, b = tracker.begin(), tracker.begin()
    tracker.queued(3)
    tracker.dequeued()
    clock.wall = 110.0
    clock.cpu = 15.0
    info = tracker.snapshot()
    assert info.inflight == 2 and info.queue_depth == 2
    assert info.rps == pytest.approx(10.0)  # 100 requests over 10 s
    assert info.p50_ms == pytest.approx(50.0) and info.p99_ms == pytest.approx(99.0)
    assert info.cpu_percent == pytest.approx(50.0)
    tracker.end(a)
    tracker.end(b)
    clock.wall = 150.0  # the latencies age out; nothing new in this window
    later = tracker.snapshot()
    assert later.inflight == 0 and later.rps == pytest.approx(2 / 40) and later.p99_ms == 0.0
    with tracker.track():
        assert tracker.inflight == 1
    assert tracker.inflight == 0 and tracker.total_requests == 103
    assert percentile([], 50) == 0.0 and percentile([1.0], 99) == 1.0


def test_load_tracker_measures_real_cpu() -> None:
    tracker = LoadTracker()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert tracker.snapshot().cpu_percent > 10
