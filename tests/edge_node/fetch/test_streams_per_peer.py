"""A node fetches from one peer with at most ``max_streams_per_peer`` streams at once, so a
busy peer (RESOURCE_EXHAUSTED beyond its per-node stream limit) is never taken for a failed
one: the fetch waits for a stream to that peer instead of moving on to another owner (across
sites, a WAN crossing) or to the origin."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import CHANNEL_OPTIONS, ChannelPool, OriginClient, PeerClient
from edge_node.peer import PeerServicer
from edge_node.peer.limits import StreamLimiter
from edge_node.settings import FetchSettings
from fleetwire.v1 import peer_pb2_grpc
from support.fleet import push

SETTINGS = FetchSettings(max_in_flight=16, peer_timeout_s=10.0, origin_timeout_s=20.0, backoff_s=0.05)


@pytest.mark.parametrize(("streams_per_peer", "busy_refusals"), [(2, False), (16, True)])
async def test_fetches_wait_for_a_stream_to_a_busy_peer_instead_of_leaving_it(
    central: CentralServer,
    api: httpx.AsyncClient,
    model_file: Path,
    tmp_path: Path,
    streams_per_peer: int,
    busy_refusals: bool,
) -> None:
    chunks = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
    sizes = {c["digest"]: c["size"] for c in chunks}
    pool = ChannelPool()
    holder_store = ChunkStore(tmp_path / "holder", size_limit=1 << 30, holder="holder")
    origin = OriginClient(pool, central.grpc_address, "holder")
    holder = ChunkFetcher("holder", holder_store, PlacementView(), PeerClient(pool, "holder"), origin, SETTINGS)
    owners = {digest: ["holder"] for digest in sizes}
    holder.view.update(owners, {}, True, sizes)
    await asyncio.gather(*(holder.ensure(d, s, ["holder"]) for d, s in sizes.items()))
    # The peer lets one requesting node hold two streams at once, and it is slow: 20 ms per piece.
    servicer = PeerServicer(holder, StreamLimiter(2, 64), pace=lambda _n: asyncio.sleep(0.02))
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    store = ChunkStore(tmp_path / "asker", size_limit=1 << 30, holder="asker")
    peers = PeerClient(pool, "asker", streams_per_peer=streams_per_peer)
    asker = ChunkFetcher(
        "asker", store, PlacementView(), peers, OriginClient(pool, central.grpc_address, "asker"), SETTINGS
    )
    asker.view.update(owners, {"holder": address}, True, sizes)
    try:
        await asyncio.gather(*(asker.ensure(d, s, ["holder"]) for d, s in sizes.items()))
        stats = asker.stats
        assert stats.chunks_from_peers + stats.chunks_from_origin == len(sizes)
        if busy_refusals:  # the control: more streams than the peer allows are refused as busy
            assert stats.peer_errors["holder"] > 0 and stats.chunks_from_origin > 0
        else:
            assert not stats.peer_errors and stats.chunks_from_peers == len(sizes)
    finally:
        await server.stop(grace=None)
        await holder.close()
        await asker.close()
        await pool.close()
        holder_store.close()
        store.close()
