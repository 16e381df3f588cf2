"""Peer stream caps on a real edge: one requesting node cannot hold more than its share
of chunk streams (RESOURCE_EXHAUSTED beyond, with the reason) while other nodes are
still served, and the total cap holds across nodes; slots come back when streams end."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from conftest import EdgeFactory, push, version_state, wait_for
from fleetwire.v1 import peer_pb2, peer_pb2_grpc

#: Chunks the edge owns but nobody has: its upstream fetch retries, so their streams stay open.
STUCK = [f"{i:064x}" for i in (1, 2)]


async def _drain(stub: peer_pb2_grpc.PeerStub, digest: str, requester: str) -> bytes:
    request = peer_pb2.PeerFetchRequest(digest=digest, requester=requester)
    return b"".join([piece.data async for piece in stub.FetchChunk(request)])


async def test_streams_over_the_per_node_and_total_caps_are_refused(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    limits = {"max_peer_streams_per_node": 2, "max_peer_streams": 3}
    fetch = {"attempts": 100, "backoff_s": 1.0, "backoff_max_s": 1.0}
    edge = await make_edge("edge-0", central, limits=limits, fetch=fetch)
    manifest = (await push(api, "tiny", small_model_file)).json()["manifest"]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="rollout")
    held = manifest["chunks"][0]["digest"]
    limiter = edge.peer_servicer.limiter
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        stuck = [
            stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=d, size=10, requester="greedy", owners=["edge-0"]))
            for d in STUCK
        ]
        await wait_for(lambda: limiter.open_streams == 2, what="two streams of one node open")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub, held, "greedy")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams_per_node" in (err.value.details() or "")
        assert await _drain(stub, held, "polite") == small_model_file.read_bytes()[: manifest["chunks"][0]["size"]]

        third = stub.FetchChunk(
            peer_pb2.PeerFetchRequest(digest=f"{3:064x}", size=10, requester="other", owners=["edge-0"])
        )
        await wait_for(lambda: limiter.open_streams == 3, what="the total cap reached")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub, held, "polite")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams)" in (err.value.details() or "")

        for call in [*stuck, third]:
            call.cancel()
        await wait_for(lambda: limiter.open_streams == 0, what="slots given back")
        assert await _drain(stub, held, "greedy")
