"""The ring of recent times to first token whose p50/p99 a language model's heartbeat carries:
nearest-rank percentiles in milliseconds, the newest ``RECENT_TTFTS`` kept, none before a stream."""

from __future__ import annotations

import pytest

from edge_node.generation.metrics import RECENT_TTFTS, RecentLatencies


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    ring = RecentLatencies()
    assert ring.percentiles_ms(0.5, 0.99) is None  # nothing served yet: the heartbeat says so
    for ms in range(100, 0, -1):  # order of arrival does not matter
        ring.observe(ms / 1000)
    assert ring.percentiles_ms(0.5, 0.99, 1.0) == (50.0, 99.0, 100.0)
    single = RecentLatencies()
    single.observe(0.0123)
    assert single.percentiles_ms(0.5, 0.99) == (12.3, 12.3)


def test_only_the_newest_are_kept() -> None:
    ring = RecentLatencies()
    for _ in range(RECENT_TTFTS):
        ring.observe(5.0)  # a slow burst long ago...
    for _ in range(RECENT_TTFTS):
        ring.observe(0.01)  # ...pushed out by the streams since
    assert len(ring) == RECENT_TTFTS and ring.percentiles_ms(0.99) == (10.0,)
    with pytest.raises(ValueError, match="size"):
        RecentLatencies(0)
