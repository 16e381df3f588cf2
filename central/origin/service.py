"""Serves chunk bytes from the blob store to edges, under the owner-first rule.

Central's link is the scarce one: for each chunk only its first owner downloads
from here; everybody else must have tried the owners ahead of it (and say so)
before central sends a byte."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field

from central.errors import BadRequest, FetchFromOwners, NotFound
from central.origin.egress import TokenBucket
from central.placement import PlacementService
from central.registry.blobs import BlobStore
from fleetwire.digest import CHUNK_PIECE_BYTES, is_digest


@dataclass
class OriginStats:
    """Counters of what central sent as origin."""

    bytes_sent: int = 0
    chunks_sent: int = 0
    refused: int = 0
    bytes_by_node: Counter[str] = field(default_factory=Counter)


class OriginService:
    """Chunk streams from the origin."""

    def __init__(self, blobs: BlobStore, placement: PlacementService, bucket: TokenBucket, max_streams: int) -> None:
        self._blobs = blobs
        self._placement = placement
        self._bucket = bucket
        self._streams = asyncio.Semaphore(max_streams)
        self.stats = OriginStats()

    def check(self, digest: str, requester: str, failed_owners: Collection[str]) -> None:
        """Raise unless ``requester`` may fetch ``digest`` from the origin now."""
        if not is_digest(digest):
            raise BadRequest(f"not a sha256 digest: {digest!r}")
        if not self._blobs.has(digest):
            raise NotFound(f"chunk {digest} is not stored")
        allowed, owners = self._placement.origin_allowed(digest, requester, failed_owners)
        if not allowed:
            self.stats.refused += 1
            raise FetchFromOwners(f"fetch chunk {digest[:12]} from its owners first: {', '.join(owners)}")

    async def stream(self, digest: str, requester: str, failed_owners: Collection[str]) -> AsyncIterator[bytes]:
        """The chunk in pieces, metered by the egress bucket."""
        self.check(digest, requester, failed_owners)
        async with self._streams:
            data = await asyncio.to_thread(self._blobs.read, digest)
            for start in range(0, len(data), CHUNK_PIECE_BYTES):
                piece = data[start : start + CHUNK_PIECE_BYTES]
                await self._bucket.consume(len(piece))
                self.stats.bytes_sent += len(piece)
                self.stats.bytes_by_node[requester or "-"] += len(piece)
                yield piece
            self.stats.chunks_sent += 1
