"""Local content-addressed chunk cache shared by the node processes of a host."""

from __future__ import annotations

from edge_node.cache.chunk_store import CacheStats, ChunkStore, CorruptChunk
from edge_node.cache.hot import HotChunks

__all__ = ["CacheStats", "ChunkStore", "CorruptChunk", "HotChunks"]
