"""The edge's state metrics: cache, chunk fetches by source, the peer service,
heartbeats and versions, read from the live objects at scrape time and exported next
to the inference metrics (``edge_node.inference.metrics``) on ``/metrics``."""

from __future__ import annotations

from edge_node.observability.collector import EdgeStateCollector

__all__ = ["EdgeStateCollector"]
