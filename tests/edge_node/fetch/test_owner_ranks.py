"""Two owners that each wait on the other for a different chunk do not deadlock.

With two edges and two replicas every chunk is owned by both: A is first owner of X
and second of Y, B the reverse. Here each node has one slot per pool, A's is taken by
its fetch of Y (waiting on B) and B's by its fetch of X (waiting on A); then each is
asked, as first owner, for the chunk the other waits on. When every owned chunk shared
one pool, both first-owner fetches queued behind those waits until the peer timeout,
and then both nodes fetched both chunks from central (the distribution bench's
origin_ratio above 1.10). With a pool per owner rank each chunk leaves central once.

The nodes are the real fetch path (ChunkFetcher, PeerServicer on a gRPC server, the
origin of a real central); the test plays the desired-state follower, so it decides
when each node's placement view learns of which chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx

from central.server import CentralServer
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import CHANNEL_OPTIONS, ChannelPool, OriginClient, PeerClient
from edge_node.peer import PeerServicer
from edge_node.settings import FetchSettings
from fleetwire.v1 import peer_pb2_grpc
from support.fleet import push
from support.wait import wait_for

#: One slot per pool makes the cycle need only two chunks; a generous peer timeout, so
#: only a deadlock (never a slow machine) makes a node give up on its peer.
SETTINGS = FetchSettings(max_owned_in_flight=1, peer_timeout_s=10.0, origin_timeout_s=20.0, backoff_s=0.05)


class FetchNode:
    """One edge's chunk path: cache, placement view, fetcher and Peer service."""

    def __init__(self, node_id: str, fetcher: ChunkFetcher, servicer: PeerServicer, address: str) -> None:
        self.node_id = node_id
        self.fetcher = fetcher
        self.servicer = servicer
        self.address = address

    @property
    def view(self) -> PlacementView:
        """What this node believes about owners (the test updates it)."""
        return self.fetcher.view


@asynccontextmanager
async def fetch_node(node_id: str, central: CentralServer, cache_dir: Path) -> AsyncIterator[FetchNode]:
    """A node wired as ``edge_node.core.Edge`` wires it, without the follower."""
    store = ChunkStore(cache_dir, size_limit=1 << 30, holder=node_id)
    pool = ChannelPool()
    origin = OriginClient(pool, central.grpc_address, node_id)
    fetcher = ChunkFetcher(node_id, store, PlacementView(), PeerClient(pool, node_id), origin, SETTINGS)
    servicer = PeerServicer(fetcher, view_wait_s=60.0)
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield FetchNode(node_id, fetcher, servicer, f"127.0.0.1:{port}")
    finally:
        await server.stop(grace=None)
        await fetcher.close()
        await pool.close()
        store.close()


async def test_owners_waiting_on_each_other_get_every_chunk_from_central_once(
    central: CentralServer, api: httpx.AsyncClient, model_file: Path, tmp_path: Path
) -> None:
    chunks = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
    x, y = chunks[0]["digest"], chunks[1]["digest"]
    sizes = {x: chunks[0]["size"], y: chunks[1]["size"]}
    async with (
        fetch_node("edge-a", central, tmp_path / "a") as a,
        fetch_node("edge-b", central, tmp_path / "b") as b,
    ):
        owners = {x: [a.node_id, b.node_id], y: [b.node_id, a.node_id]}
        peers = {a.node_id: a.address, b.node_id: b.address}

        def show(node: FetchNode, digests: list[str]) -> None:  # what the desired state would do
            node.view.update({d: owners[d] for d in digests}, peers, True, {d: sizes[d] for d in digests})

        show(a, [x, y])
        show(b, [x])  # B learns of Y later: A's request for it waits at B

        a_gets_y = asyncio.create_task(a.fetcher.ensure(y, sizes[y], owners[y]))
        await wait_for(lambda: b.servicer.limiter.open_streams == 1, what="A's request for Y waiting at B")
        b_gets_x = asyncio.create_task(b.fetcher.ensure(x, sizes[x], owners[x]))
        # B's slot is held (its request for X is at A) or the request was already served.
        await wait_for(lambda: a.servicer.limiter.open_streams + a.servicer.chunks_served == 1, what="X at A")
        show(b, [x, y])  # now B, first owner of Y, fetches it for A
        await asyncio.wait_for(asyncio.gather(a_gets_y, b_gets_x), timeout=60.0)

        origin = central.central.origin.stats
        assert dict(origin.bytes_by_node) == {a.node_id: sizes[x], b.node_id: sizes[y]}
        assert origin.chunks_sent == 2
        for node, from_peer in ((a, b), (b, a)):
            stats = node.fetcher.stats
            assert (stats.chunks_from_origin, stats.chunks_from_peers) == (1, 1), node.node_id
            assert not stats.peer_errors, node.node_id
            assert from_peer.servicer.chunks_served == 1
