"""Central's Prometheus metrics: a collector that reads live state at scrape time
(membership, placement, registry, origin, gateway counters, rollouts) plus a few
instruments for what state alone cannot tell (gateway latency, requests by outcome,
membership events by type). One ``CollectorRegistry`` per ``Central``, never the
global one, so several centrals in one process keep apart."""

from __future__ import annotations

from central.observability.collector import CentralStateCollector
from central.observability.instruments import CentralMetrics, gateway_outcome

__all__ = ["CentralMetrics", "CentralStateCollector", "gateway_outcome"]
