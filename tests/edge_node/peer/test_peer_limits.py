"""Peer stream caps on a real edge: one requesting node cannot hold more than its share
of chunk streams (RESOURCE_EXHAUSTED beyond, with the reason) while other nodes are
still served, and the total cap holds across nodes; slots come back when streams end.

Streams are held open by asking for chunks the edge owns but cannot get yet: central's
egress is capped at 1 byte/s once its burst is spent, so the edge's own fetches of a
second model stall and every stream relaying one of those chunks waits on them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for


async def _drain(stub: peer_pb2_grpc.PeerStub, digest: str, requester: str) -> bytes:
    request = peer_pb2.PeerFetchRequest(digest=digest, requester=requester)
    return b"".join([piece.data async for piece in stub.FetchChunk(request)])


@pytest.fixture
async def slow_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """A central whose origin sends its 256 KiB burst, then 1 byte/s."""
    server = CentralServer(central_settings(tmp_path / "central", origin={"egress_bytes_s": 1}))
    await server.start()
    yield server
    await server.stop()


async def test_streams_over_the_per_node_and_total_caps_are_refused(
    slow_central: CentralServer, make_edge: EdgeFactory, small_model_file: Path, model_file: Path
) -> None:
    limits = {"max_peer_streams_per_node": 2, "max_peer_streams": 3}
    fetch = {"attempts": 100, "backoff_s": 1.0, "backoff_max_s": 1.0}
    edge = await make_edge("edge-0", slow_central, limits=limits, fetch=fetch)
    async with httpx.AsyncClient(base_url=slow_central.http_url, timeout=30) as api:
        manifest = (await push(api, "tiny", small_model_file)).json()["manifest"]
        await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="rollout")
        chunks = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
    held = manifest["chunks"][0]["digest"]
    # The last chunks of the ~2.7 MB model: far past the burst, so the edge cannot have them.
    stuck = [c["digest"] for c in chunks[-3:]]
    await wait_for(lambda: all(edge.edge.view.owners(d) == ["edge-0"] for d in stuck), what="the edge owning them")
    assert not edge.edge.store.has_many(stuck)
    limiter = edge.edge.peer_servicer.limiter
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        greedy = [stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=d, requester="greedy")) for d in stuck[:2]]
        await wait_for(lambda: limiter.open_streams == 2, what="two streams of one node open")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub, held, "greedy")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams_per_node" in (err.value.details() or "")
        assert await _drain(stub, held, "polite") == small_model_file.read_bytes()[: manifest["chunks"][0]["size"]]

        third = stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=stuck[2], requester="other"))
        await wait_for(lambda: limiter.open_streams == 3, what="the total cap reached")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub, held, "polite")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams)" in (err.value.details() or "")

        for call in [*greedy, third]:
            call.cancel()
        await wait_for(lambda: limiter.open_streams == 0, what="slots given back")
        assert await _drain(stub, held, "greedy")
