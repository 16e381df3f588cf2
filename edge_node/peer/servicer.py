"""``modelfleet.v1.Peer``: serve chunks from the cache. An owner asked for a chunk it
does not hold yet fetches it (single-flight, through the fetcher) and streams it on,
rather than sending the requester to central.

What a requester says is never trusted for that: a node relays only digests that its
own desired state (from central) says it owns, at the size that state's manifest
gives. A peer that names this node in ``owners`` for anything else gets NOT_FOUND, so
it cannot make this node fetch arbitrary chunks from the origin on its behalf, nor
poison a fetch with a wrong size.

Nor does it serve what it merely still holds: a chunk it serves must be in a manifest of
its current desired state. The cache keeps chunks of versions long gone (deleted,
superseded) until it evicts them, and central refuses those to a node that asks for them;
an edge must not hand them out instead; ``HasChunks`` answers only for those chunks too.
Within the current desired state any node may still read any chunk (this node does not
know the caller's desired state) — see docs/security.md. Under TLS the caller is the node
its certificate names, and a ``requester`` naming another node is refused
(``edge_node.peer.identity``); the per-node stream cap counts the caller, never the
``requester`` it names.

Every piece sent waits for the serve cap (``pace``, ``edge_node.transfer``) first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from edge_node.fetch import ChunkFetcher, FetchFailed
from edge_node.peer.identity import Caller, ClaimCheck, ClaimRefused, caller_of
from edge_node.peer.limits import StreamLimiter, StreamsExhausted
from fleetwire.digest import PEER_PIECE_BYTES, is_digest
from fleetwire.v1 import common_pb2, peer_pb2, peer_pb2_grpc

_T = TypeVar("_T")

#: How long a request naming this node as owner of a chunk its desired state does not
#: list yet waits for that state (the requester may have received its own copy first).
VIEW_WAIT_S = 1.0


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """Chunks for other edges."""

    def __init__(
        self,
        fetcher: ChunkFetcher,
        limiter: StreamLimiter | None = None,
        view_wait_s: float = VIEW_WAIT_S,
        pace: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """``limiter`` caps concurrent FetchChunk streams per requesting node and in total
        (default: 8 per node, 64 in all); ``pace(n)`` returns when ``n`` more bytes may go."""
        self._fetcher = fetcher
        self._pace = pace
        self._view_wait_s = view_wait_s
        self.limiter = limiter or StreamLimiter(per_requester=8, total=64)
        self.chunks_served = 0
        #: Requests for chunks not held here that this node does not own (never relayed).
        self.relays_refused = 0
        #: Requests for chunks held here but in no manifest of this node's desired state.
        self.unlisted_refused = 0
        self.bytes_served = 0
        #: Calls whose ``requester`` is not the node their certificate names.
        self.claims = ClaimCheck()

    async def _checked_caller(self, context: grpc.aio.ServicerContext, requester: str, *, required: bool) -> Caller:
        """The caller, once its claim to be ``requester`` holds (``ClaimCheck.check``); else the
        call is aborted PERMISSION_DENIED."""
        caller = caller_of(context)
        try:
            self.claims.check(caller, requester, required=required)
        except ClaimRefused as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return caller

    async def FetchChunk(
        self, request: peer_pb2.PeerFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ChunkData]:
        caller = await self._checked_caller(context, request.requester, required=True)
        requester = caller.name  # never request.requester alone: the caller chooses that
        try:
            self.limiter.acquire(requester)
        except StreamsExhausted as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        try:
            async for piece in self._stream(request, context):
                yield piece
        finally:
            self.limiter.release(requester)

    async def _stream(
        self, request: peer_pb2.PeerFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ChunkData]:
        digest = request.digest
        if not is_digest(digest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a sha256 digest: {digest[:80]!r}")
        claimed = self._fetcher.node_id in request.owners
        data = self._fetcher.hot.get(digest) or await asyncio.to_thread(self._fetcher.store.get, digest)
        if data is not None and not await self._listed(digest, claimed):
            self.unlisted_refused += 1
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"chunk {digest[:12]} is in no version of this node's desired state"
            )
        if data is None and request.held_only:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"chunk {digest[:12]} is not held here")
        if data is None:
            owned = await self._owned(digest, claimed)
            if owned is None:
                self.relays_refused += 1
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"chunk {digest[:12]} is not held here and this node does not own it"
                )
            assert owned is not None
            owners, size = owned
            try:
                await self._fetcher.ensure(digest, size, owners)
            except FetchFailed as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            data = await asyncio.to_thread(self._fetcher.read, digest)
            if data is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"chunk {digest[:12]} was evicted")
        assert data is not None
        for start in range(0, len(data), PEER_PIECE_BYTES):
            piece = data[start : start + PEER_PIECE_BYTES]
            if self._pace is not None:
                await self._pace(len(piece))
            yield common_pb2.ChunkData(data=piece)
        self.chunks_served += 1
        self.bytes_served += len(data)

    async def _owned(self, digest: str, claimed: bool) -> tuple[list[str], int] | None:
        """Owners and size of a chunk this node's own desired state says it owns, else None."""
        view = self._fetcher.view

        def owned() -> tuple[list[str], int] | None:
            owners, size = view.owners(digest), view.size(digest)
            return (owners, size) if self._fetcher.node_id in owners and size is not None else None

        return await self._in_view(owned, claimed)

    async def _listed(self, digest: str, claimed: bool) -> bool:
        """Whether a manifest of this node's desired state lists the chunk."""
        view = self._fetcher.view
        return await self._in_view(lambda: view.size(digest), claimed) is not None

    async def _in_view(self, found: Callable[[], _T | None], claimed: bool) -> _T | None:
        """``found()`` on this node's desired state. When the requester ``claimed`` this node
        owns the chunk, wait up to ``view_wait_s`` for a desired state that may be on its way
        (the requester may have received its own first); the claim itself decides nothing."""
        view = self._fetcher.view
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._view_wait_s if claimed else 0.0)
        while True:
            if (answer := found()) is not None:
                return answer
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):
                    await view.changed()
            except TimeoutError:
                return None

    async def HasChunks(
        self, request: peer_pb2.HasChunksRequest, context: grpc.aio.ServicerContext
    ) -> peer_pb2.HasChunksReply:
        await self._checked_caller(context, request.requester, required=False)
        view = self._fetcher.view  # only what FetchChunk would serve: listed in this node's desired state
        digests = [d for d in request.digests if is_digest(d) and view.size(d) is not None]
        present = await asyncio.to_thread(self._fetcher.store.has_many, digests)
        return peer_pb2.HasChunksReply(present=[d for d in digests if d in present])
