"""Fetch order across sites: an edge asks owners of its own site first, then other sites',
then central, and central's origin rule still lets it in once every owner ahead failed.

Two sites of two nodes, two replicas: site-aware placement (central's own, with the nodes
registered in its directory) gives every chunk the owners ``[home 0, other 0, home 1,
other 1]``. The nodes are the real fetch path (ChunkFetcher, PeerServicer on a gRPC
server on port 0, the origin of a real central); the test plays the desired-state
follower, showing every node the placement central computed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import httpx

from central.membership import NodeRecord
from central.server import CentralServer
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import CHANNEL_OPTIONS, ChannelPool, OriginClient, PeerClient
from edge_node.peer import PeerServicer
from edge_node.settings import FetchSettings
from fleetwire.v1 import peer_pb2_grpc
from support.fleet import push

SETTINGS = FetchSettings(peer_timeout_s=10.0, origin_timeout_s=20.0, backoff_s=0.05, attempts=3)
SITES = {"east-1": "east", "east-2": "east", "west-1": "west", "west-2": "west"}


class SiteNode:
    """One edge's chunk path in a site: cache, placement view, fetcher and Peer service."""

    def __init__(self, node_id: str, fetcher: ChunkFetcher, servicer: PeerServicer, server: grpc.aio.Server) -> None:
        self.node_id = node_id
        self.fetcher = fetcher
        self.servicer = servicer
        self.server = server
        self.address = ""

    async def go_down(self) -> None:
        """Stop answering peers (the node's process died)."""
        await self.server.stop(grace=None)


@asynccontextmanager
async def site_node(node_id: str, central: CentralServer, cache_dir: Path) -> AsyncIterator[SiteNode]:
    """A node wired as ``edge_node.core.Edge`` wires it, without the follower."""
    store = ChunkStore(cache_dir, size_limit=1 << 30, holder=node_id)
    pool = ChannelPool()
    origin = OriginClient(pool, central.grpc_address, node_id)
    view = PlacementView(SITES[node_id])
    fetcher = ChunkFetcher(node_id, store, view, PeerClient(pool, node_id), origin, SETTINGS)
    servicer = PeerServicer(fetcher, view_wait_s=0.0)
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    node = SiteNode(node_id, fetcher, servicer, server)
    node.address = f"127.0.0.1:{port}"
    try:
        yield node
    finally:
        await server.stop(grace=None)
        await fetcher.close()
        await pool.close()
        store.close()


@asynccontextmanager
async def two_sites(
    central: CentralServer, api: httpx.AsyncClient, model_file: Path, tmp_path: Path
) -> AsyncIterator[tuple[dict[str, SiteNode], dict[str, list[str]], dict[str, int]]]:
    """The four nodes, registered with central and shown its placement: (nodes, owners, sizes)."""
    chunks = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
    sizes = {c["digest"]: c["size"] for c in chunks}
    async with AsyncExitStack() as stack:
        nodes = {n: await stack.enter_async_context(site_node(n, central, tmp_path / n)) for n in SITES}
        for node in nodes.values():
            central.central.directory.register(NodeRecord(node.node_id, node.address, "", site=SITES[node.node_id]))
        placement = central.central.placement
        owners = {d: placement.owners(d) for d in sizes}
        peers = {n.node_id: n.address for n in nodes.values()}
        for node in nodes.values():
            node.fetcher.view.update(owners, peers, True, sizes, dict(SITES))
        yield nodes, owners, sizes


def test_placement_gives_each_site_a_way_in() -> None:
    """The layout the other tests rely on (checked here so a failure names its cause)."""
    view = PlacementView("west")
    view.update({}, {}, True, None, dict(SITES))
    assert view.same_site_first(["east-1", "west-2", "east-2", "west-1"]) == ["west-2", "west-1", "east-1", "east-2"]
    assert view.site_of("stranger") == "default"


async def test_a_site_pulls_a_chunk_across_once_and_shares_it_inside(
    central: CentralServer, api: httpx.AsyncClient, model_file: Path, tmp_path: Path
) -> None:
    async with two_sites(central, api, model_file, tmp_path) as (nodes, owners, sizes):
        digest = next(iter(sizes))
        size = sizes[digest]
        home_0, other_0, home_1, other_1 = (nodes[n] for n in owners[digest])
        assert SITES[home_0.node_id] == SITES[home_1.node_id] != SITES[other_0.node_id] == SITES[other_1.node_id]

        # The other site's second owner asks its own site's first owner, which relays from
        # the home site's first owner, which alone reads origin.
        await other_1.fetcher.ensure(digest, size, owners[digest])
        await home_1.fetcher.ensure(digest, size, owners[digest])

        assert dict(central.central.origin.stats.bytes_by_node) == {home_0.node_id: size}
        assert other_1.fetcher.stats.bytes_from_own_site == size
        assert other_0.fetcher.stats.bytes_from_other_sites == size  # the one crossing
        assert home_1.fetcher.stats.bytes_from_own_site == size
        assert home_0.servicer.chunks_served == 2  # to other_0 and home_1
        assert other_0.servicer.chunks_served == 1
        for node in nodes.values():
            assert node.fetcher.stats.bytes_from_other_sites == (size if node is other_0 else 0)
            assert not node.fetcher.stats.peer_errors


async def test_a_site_without_owners_falls_back_to_other_sites_then_origin(
    central: CentralServer, api: httpx.AsyncClient, model_file: Path, tmp_path: Path
) -> None:
    async with two_sites(central, api, model_file, tmp_path) as (nodes, owners, sizes):
        first = next(iter(sizes))
        home_0, other_0, home_1, other_1 = (nodes[n] for n in owners[first])
        # Another chunk with the same last owner: then its owners ahead are the same three.
        second = next(d for d in sizes if d != first and owners[d][3] == other_1.node_id)
        assert set(owners[second][:3]) == {home_0.node_id, other_0.node_id, home_1.node_id}

        await other_0.go_down()  # its site's other owner: the only one of the site ahead of it
        await other_1.fetcher.ensure(first, sizes[first], owners[first])
        stats = other_1.fetcher.stats
        assert stats.bytes_from_other_sites == sizes[first]
        assert stats.peer_errors[other_0.node_id] >= 1

        await home_0.go_down()
        await home_1.go_down()  # every owner ahead of other_1 is down now
        refused = central.central.origin.stats.refused
        await other_1.fetcher.ensure(second, sizes[second], owners[second])
        assert stats.chunks_from_origin == 1
        assert central.central.origin.stats.refused == refused  # the failed list named all three
        assert central.central.origin.stats.bytes_by_node[other_1.node_id] == sizes[second]
