"""Serves chunk bytes from the blob store to edges, under the owner-first rule.

Central's link is the scarce one: for each chunk only its first owner downloads
from here; everybody else must have tried the owners ahead of it (and say so)
before central sends a byte. At most ``max_streams`` chunks are sent at once and
at most ``max_waiting`` more streams wait for a slot; beyond that a stream is refused
at once (RESOURCE_EXHAUSTED), and the edge retries after its backoff or another source."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field

from central.errors import BadRequest, FetchFromOwners, NotFound, Overloaded, PermissionDenied
from central.origin.egress import EgressBucket
from central.placement import PlacementService
from central.storage.protocols import ChunkBlobs, CorruptBlob
from fleetwire.digest import CHUNK_PIECE_BYTES, is_digest


@dataclass
class OriginStats:
    """Counters of what central sent as origin."""

    bytes_sent: int = 0
    chunks_sent: int = 0
    refused: int = 0
    denied: int = 0
    """Requests of an authenticated node for a chunk outside its desired state."""
    overloaded: int = 0
    """Streams refused because every slot was taken and the waiting queue was full."""
    bytes_by_node: Counter[str] = field(default_factory=Counter)


class OriginService:
    """Chunk streams from the origin."""

    def __init__(
        self,
        blobs: ChunkBlobs,
        placement: PlacementService,
        bucket: EgressBucket,
        max_streams: int,
        max_waiting: int = 1024,
        entitled: Callable[[str, str], bool] | None = None,
    ) -> None:
        """``entitled(node_id, digest)``: whether a node's desired state lets it read the chunk
        (asked only for a requester whose identity a node token proved)."""
        if max_streams < 1 or max_waiting < 0:
            raise ValueError("max_streams must be >= 1 and max_waiting >= 0")
        self._blobs = blobs
        self._placement = placement
        self._entitled = entitled
        self._bucket = bucket
        self._streams = asyncio.Semaphore(max_streams)
        self.max_streams = max_streams
        self.max_waiting = max_waiting
        #: Streams waiting for a slot right now.
        self.waiting = 0
        #: Streams being sent right now.
        self.active = 0
        self.stats = OriginStats()

    async def check(
        self, digest: str, requester: str, failed_owners: Collection[str], *, verified: bool = False
    ) -> None:
        """Raise unless ``requester`` may fetch ``digest`` from the origin now. ``verified``: the
        requester is a node its token proved, and gets only chunks of its desired state (asked
        before whether the chunk exists, so a refusal tells nothing about what central stores)."""
        if not is_digest(digest):
            raise BadRequest(f"not a sha256 digest: {digest!r}")
        if verified and self._entitled is not None and not self._entitled(requester, digest):
            self.stats.denied += 1
            raise PermissionDenied(f"chunk {digest[:12]} is in no version of node {requester!r}'s desired state")
        # A thread: on an object store this is a network round trip.
        if not await asyncio.to_thread(self._blobs.has, digest):
            raise NotFound(f"chunk {digest} is not stored")
        allowed, owners = self._placement.origin_allowed(digest, requester, failed_owners)
        if not allowed:
            self.stats.refused += 1
            raise FetchFromOwners(f"fetch chunk {digest[:12]} from its owners first: {', '.join(owners)}")

    async def stream(
        self, digest: str, requester: str, failed_owners: Collection[str], *, verified: bool = False
    ) -> AsyncIterator[bytes]:
        """The chunk in pieces, metered by the egress bucket (``verified``: see ``check``)."""
        await self.check(digest, requester, failed_owners, verified=verified)
        await self._slot()
        self.active += 1
        try:
            try:
                data = await asyncio.to_thread(self._blobs.read, digest)
            except CorruptBlob as exc:  # never served; the edge tries its other sources
                raise NotFound(f"{exc}; not served") from exc
            except FileNotFoundError as exc:  # deleted since the check
                raise NotFound(f"chunk {digest} is not stored") from exc
            for start in range(0, len(data), CHUNK_PIECE_BYTES):
                piece = data[start : start + CHUNK_PIECE_BYTES]
                await self._bucket.consume(len(piece))
                self.stats.bytes_sent += len(piece)
                self.stats.bytes_by_node[requester or "-"] += len(piece)
                yield piece
            self.stats.chunks_sent += 1
        finally:
            self.active -= 1
            self._streams.release()

    async def _slot(self) -> None:
        """Take a stream slot, waiting in line; Overloaded when the line is full."""
        if self._streams.locked() and self.waiting >= self.max_waiting:
            self.stats.overloaded += 1
            raise Overloaded(
                f"central is sending {self.max_streams} chunks and {self.waiting} more streams wait"
                " (origin.max_concurrent_streams, origin.max_waiting_streams); retry later or fetch from a peer"
            )
        self.waiting += 1
        try:
            await self._streams.acquire()
        finally:
            self.waiting -= 1
