"""A peer's ``owners`` list is not trusted: a node relays (fetches upstream for a
requester) only chunks its own desired state says it owns. A requester naming the node
as owner of a chunk central stores but never sent this node (a version pushed without
activation) gets NOT_FOUND, and the node fetched nothing for it; a request that only
arrives ahead of the owner's own desired state waits for it and is served."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, push, version_state
from support.wait import wait_for


async def test_a_peer_cannot_make_a_node_fetch_chunks_it_does_not_own(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, model_file: Path
) -> None:
    edge = await make_edge("edge-0", central)
    tiny = (await push(api, "tiny", small_model_file)).json()["manifest"]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny on the edge")
    hidden = (await push(api, "hidden", model_file, activate="false")).json()["manifest"]["chunks"][0]
    assert edge.edge.view.owners(hidden["digest"]) == [] and not edge.edge.store.has(hidden["digest"])
    fetched = edge.edge.fetcher.stats.chunks_from_origin

    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        request = peer_pb2.PeerFetchRequest(
            digest=hidden["digest"], size=hidden["size"], requester="mallory", owners=["edge-0"]
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.FetchChunk(request).read()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert "does not own it" in (refused.value.details() or "")

        owned = tiny["chunks"][0]  # what it does hold it still serves
        pieces = [p.data async for p in stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=owned["digest"]))]
        assert b"".join(pieces) == small_model_file.read_bytes()[: owned["size"]]

    assert edge.edge.peer_servicer.relays_refused == 1
    assert edge.edge.fetcher.stats.chunks_from_origin == fetched and not edge.edge.store.has(hidden["digest"])


async def test_a_request_ahead_of_the_owners_desired_state_waits_for_it(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    """A requester may learn the placement before the owner does: the owner waits (up to
    ``fetch.relay_view_wait_s``) for its own desired state, then relays the chunk."""
    edge = await make_edge("edge-0", central, fetch={"relay_view_wait_s": 10.0})
    published = small_model_file.read_bytes()
    digest = hashlib.sha256(published).hexdigest()  # the tiny model is one chunk
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        request = peer_pb2.PeerFetchRequest(digest=digest, requester="early", owners=["edge-0"])
        early = asyncio.create_task(_read(stub.FetchChunk(request)))
        await asyncio.sleep(0.2)
        assert not early.done()  # waiting: this node does not know the chunk yet
        assert (await push(api, "tiny", small_model_file)).status_code == 201
        assert await early == published
    assert edge.edge.peer_servicer.relays_refused == 0


async def _read(call: grpc.aio.UnaryStreamCall) -> bytes:  # type: ignore[type-arg]
    return b"".join([piece.data async for piece in call])


async def test_a_chunk_still_cached_from_a_replaced_version_is_not_served(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, tmp_path: Path
) -> None:
    """Central refuses a node the chunks of versions outside its desired state; a peer holding
    such a chunk in its cache (a replaced version, not evicted yet) must not hand it out instead."""
    edge = await make_edge("edge-0", central, fetch={"relay_view_wait_s": 0.3})
    old = (await push(api, "tiny", small_model_file)).json()["manifest"]["chunks"][0]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny 1 on the edge")
    other = build_mlp(tmp_path / "other.onnx", width=48, hidden_layers=1)
    new = (await push(api, "tiny", other)).json()["manifest"]["chunks"][0]
    await wait_for(lambda: version_state(edge, "tiny", "2") == "complete", what="tiny 2 on the edge")
    await wait_for(lambda: edge.edge.view.size(old["digest"]) is None, what="tiny 1 out of the edge's desired state")
    assert edge.edge.store.has(old["digest"])  # still cached: only eviction removes it

    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        for owners in ([], ["edge-0"]):  # a claim of ownership only waits (0.3 s here) for a state
            request = peer_pb2.PeerFetchRequest(digest=old["digest"], requester="mallory", owners=owners)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.FetchChunk(request).read()
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            assert "in no version of this node's desired state" in (refused.value.details() or "")
        current = await _read(stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=new["digest"], requester="peer")))
        assert len(current) == new["size"]
    assert edge.edge.peer_servicer.unlisted_refused == 2 and edge.edge.peer_servicer.relays_refused == 0


async def test_has_chunks_answers_only_for_chunks_of_the_nodes_desired_state(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, tmp_path: Path
) -> None:
    """``HasChunks`` told anyone which digests the cache held, a replaced version's included
    (issue 24, hole 8); it now answers only for what ``FetchChunk`` would serve."""
    edge = await make_edge("edge-0", central)
    old = (await push(api, "tiny", small_model_file)).json()["manifest"]["chunks"][0]["digest"]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny 1 on the edge")
    other = build_mlp(tmp_path / "other.onnx", width=48, hidden_layers=1)
    new = (await push(api, "tiny", other)).json()["manifest"]["chunks"][0]["digest"]
    await wait_for(lambda: version_state(edge, "tiny", "2") == "complete", what="tiny 2 on the edge")
    await wait_for(lambda: edge.edge.view.size(old) is None, what="tiny 1 out of the edge's desired state")
    assert edge.edge.store.has(old)  # still cached

    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        reply = await peer_pb2_grpc.PeerStub(channel).HasChunks(
            peer_pb2.HasChunksRequest(digests=[old, new, "0" * 64]), timeout=10
        )
    assert list(reply.present) == [new]  # before: [old, new]
