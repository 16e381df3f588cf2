"""gRPC clients for the two remote sources of chunk bytes: peers and the origin.

Both read a whole chunk into memory (chunks are ~1 MiB) and stop early when more
bytes arrive than the manifest says, so a misbehaving sender cannot make us buffer
without bound. Both take an optional ``pacer`` (the fetch cap, ``edge_node.transfer``):
a chunk's bytes are reserved before its call starts and each piece is paced as it
arrives, so a big chunk is paced as it streams in (gRPC flow control slows the sender)
and a call under a low cap still ends before its deadline.

Under TLS a channel to a peer accepts only the certificate of the node the placement says
is there (``fleetwire.peer_identity``): another node's, or one naming no node, fails the
handshake, and the fetch goes to the next owner or the origin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Protocol

import grpc

from edge_node.auth import NodeCredential
from fleetwire.peer_identity import peer_channel_options
from fleetwire.v1 import common_pb2, peer_pb2, peer_pb2_grpc, registry_pb2, registry_pb2_grpc

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.enable_retries", 0),
    # gRPC's own reconnect backoff grows to 120 s by default: after a long outage of central
    # its channel would refuse every call for up to that long after central is back, whatever
    # the follower's backoff (which paces the attempts). Capped to stay below it.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # A connection of its own per channel: gRPC otherwise shares one between channels to the
    # same address in a process (edges run in one process in tests), and a peer counts its
    # per-node stream cap per connection when no client certificate names the caller.
    ("grpc.use_local_subchannel_pool", 1),
    # As a server (the Peer service): peers' 20 s keep-alive pings are welcome (central's too).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
]


class FetchPacer(Protocol):
    """A byte-rate cap on fetched chunks (``edge_node.transfer.TransferGovernor``)."""

    def reserve_fetch(self, size: int) -> AbstractAsyncContextManager[None]:
        """Held around one chunk's call: waits, before it starts, for room for ``size`` bytes."""

    async def pace_fetch(self, n: int) -> None:
        """``n`` bytes arrived: return when the cap allows more."""


def _reserved(pacer: FetchPacer | None, size: int) -> AbstractAsyncContextManager[None]:
    return pacer.reserve_fetch(size) if pacer is not None else nullcontext()


class OversizedChunk(Exception):
    """A sender streamed more bytes than the chunk has."""


async def _collect(stream: AsyncIterable[common_pb2.ChunkData], size: int, pacer: FetchPacer | None = None) -> bytes:
    buf = bytearray()
    async for piece in stream:
        buf += piece.data
        if size and len(buf) > size:
            raise OversizedChunk(f"sender streamed more than {size} bytes")
        if pacer is not None:
            await pacer.pace_fetch(len(piece.data))
    return bytes(buf)


#: What gRPC says when a server's certificate does not carry the name the channel checks.
_NAME_CHECK_FAILED = "Hostname Verification Check failed"


def wrong_certificate(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call failed because the server's certificate is not the expected node's."""
    return _NAME_CHECK_FAILED in (exc.details() or "")


class ChannelPool:
    """One channel per address (and, to a peer, per node expected there), reused by every
    fetch to it; TLS channels (verifying the server, showing our certificate) when
    ``credentials`` are given."""

    def __init__(self, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channels: dict[tuple[str, str | None], grpc.aio.Channel] = {}
        self._credentials = credentials

    def get(self, address: str, node: str | None = None) -> grpc.aio.Channel:
        """The channel to ``address``, created on first use. With TLS and ``node``, the
        server must show ``node``'s certificate (checked instead of the host name)."""
        key = (address, node if self._credentials is not None else None)
        channel = self._channels.get(key)
        if channel is None:
            if self._credentials is not None:
                options = CHANNEL_OPTIONS + (peer_channel_options(node) if node is not None else [])
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[key] = channel
        return channel

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class PeerClient:
    """Fetches chunks from other edges' Peer services.

    At most ``streams_per_peer`` streams to one peer at once, the rest wait here: a peer
    refuses a node's streams beyond its ``limits.max_peer_streams_per_node`` (8 by default)
    with RESOURCE_EXHAUSTED, and a fetcher that took the refusal as a failure moved on to the
    next owner, which, across sites, meant a WAN crossing for a chunk the own site's owner was
    about to have (measured: a quarter more bytes into each site)."""

    def __init__(
        self, pool: ChannelPool, node_id: str, pacer: FetchPacer | None = None, streams_per_peer: int = 8
    ) -> None:
        self._pool = pool
        self._node_id = node_id
        self._pacer = pacer
        self._streams_per_peer = streams_per_peer
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def fetch(
        self,
        peer: str,
        address: str,
        digest: str,
        size: int,
        owners: list[str],
        timeout: float,
        held_only: bool = False,
    ) -> bytes:
        """One chunk from node ``peer`` at ``address`` (``held_only``: only if it holds it, no relay)."""
        stub = peer_pb2_grpc.PeerStub(self._pool.get(address, peer))
        request = peer_pb2.PeerFetchRequest(
            digest=digest, size=size, requester=self._node_id, owners=owners, held_only=held_only
        )
        slots = self._slots.get(address)
        if slots is None:
            slots = self._slots[address] = asyncio.Semaphore(self._streams_per_peer)
        async with slots, _reserved(self._pacer, size):
            return await _collect(stub.FetchChunk(request, timeout=timeout), size, self._pacer)

    async def has_chunks(self, peer: str, address: str, digests: list[str], timeout: float = 5.0) -> set[str]:
        """Which of ``digests`` node ``peer`` at ``address`` holds."""
        stub = peer_pb2_grpc.PeerStub(self._pool.get(address, peer))
        request = peer_pb2.HasChunksRequest(digests=digests, requester=self._node_id)
        reply = await stub.HasChunks(request, timeout=timeout)
        return set(reply.present)


class OriginClient:
    """Fetches chunks from central, saying which owners were tried first, and presenting
    this node's credential."""

    def __init__(
        self,
        pool: ChannelPool,
        central: str | Callable[[], str],
        node_id: str,
        credential: NodeCredential | None = None,
        pacer: FetchPacer | None = None,
    ) -> None:
        """``central``: its address, or a function giving the one in use now (an edge with
        several centrals fetches from the one its desired-state link is on)."""
        self._pacer = pacer
        self._pool = pool
        self._central = central if callable(central) else lambda: central
        self._node_id = node_id
        self._credential = credential or NodeCredential()

    async def fetch(self, digest: str, size: int, failed_owners: list[str], timeout: float) -> bytes:
        """One chunk from the origin."""
        stub = registry_pb2_grpc.RegistryStub(self._pool.get(self._central()))
        request = registry_pb2.OriginFetchRequest(digest=digest, node_id=self._node_id, failed_owners=failed_owners)
        async with _reserved(self._pacer, size):
            stream = stub.FetchChunk(request, timeout=timeout, metadata=self._credential.metadata())
            return await _collect(stream, size, self._pacer)
