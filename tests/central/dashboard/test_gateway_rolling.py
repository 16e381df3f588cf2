"""The gateway's rolling rate and latency that the dashboard's chart draws."""

from __future__ import annotations

from central.gateway.rolling import RollingStats


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rate_and_percentiles_of_the_last_seconds_and_a_point_per_second() -> None:
    clock = Clock(1000.2)
    stats = RollingStats(window_s=5, clock=clock)
    for ms in range(1, 101):  # 100 requests in second 1000, 1..100 ms
        stats.record(ms / 1000, ok=ms != 100)
    clock.now = 1002.5  # second 1001 had nothing
    stats.record(0.5, ok=True)

    series = stats.series()  # seconds 998..1001, complete ones only
    assert [p["t"] for p in series] == [998, 999, 1000, 1001]
    assert [p["requests"] for p in series] == [0, 0, 100, 0]
    assert series[2]["errors"] == 1 and series[2]["p50_ms"] == 51.0 and series[2]["p99_ms"] == 99.0
    assert stats.summary(last_s=5) == {"rps": 20.0, "errors": 1, "p50_ms": 51.0, "p99_ms": 99.0}

    clock.now = 1010.0  # everything has left the window
    assert stats.summary(last_s=5)["rps"] == 0.0
    assert all(p["requests"] == 0 for p in stats.series())


def test_latency_samples_per_second_are_bounded() -> None:
    clock = Clock(50.0)
    stats = RollingStats(window_s=3, samples_per_bucket=10, clock=clock)
    for _ in range(1000):
        stats.record(0.001, ok=True)
    clock.now = 51.0
    (point,) = [p for p in stats.series() if p["t"] == 50]
    assert point["requests"] == 1000 and point["p99_ms"] == 1.0
