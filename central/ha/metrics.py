"""A replica's own metric families: every replica exports its own (label them by pod)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def replica_metrics(h: dict[str, Any]) -> Iterator[Metric]:
    """One replica of a replicated central: every replica exports its own (label them by pod)."""
    yield _gauge("modelfleet_replica_leader", "1 while this replica leads (places chunks, runs rollouts).", h["leader"])
    yield _gauge("modelfleet_replica_partitions", "Heartbeat partitions this replica owns.", len(h["partitions"]))
    yield _gauge("modelfleet_replicas_live", "Replicas this one sees up (itself included).", len(h["replicas"]))
    yield _gauge("modelfleet_replica_fleet_generation", "The shared fleet generation last read.", h["fleet_generation"])
    yield _gauge(
        "modelfleet_replica_links_up",
        "1 while both PostgreSQL sessions (control, fleet feed) are up.",
        h["control_connected"] and h["generation_connected"],
    )
    yield _counter(
        "modelfleet_replica_liveness_writes", "Node liveness rows this replica wrote as a partition owner.",
        h["liveness_writes"],
    )  # fmt: skip
    yield _counter(
        "modelfleet_replica_fenced_writes", "Writes refused because this replica's epoch was stale.", h["stale_writes"]
    )
    yield _counter("modelfleet_replica_store_errors", "Shared-state reads or writes that failed.", h["write_errors"])
