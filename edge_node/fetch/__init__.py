"""Getting chunks: cache, then owners in placement order, then central."""

from __future__ import annotations

from edge_node.fetch.fetcher import ChunkFetcher, FetchFailed, FetchStats
from edge_node.fetch.placement_view import PlacementView

__all__ = ["ChunkFetcher", "FetchFailed", "FetchStats", "PlacementView"]
