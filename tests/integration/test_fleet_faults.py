"""Faults during a rollout: an owner stops, a peer lies, an edge restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.digest import CHUNK_PIECE_BYTES
from fleetwire.v1 import common_pb2, peer_pb2, peer_pb2_grpc, registry_pb2, registry_pb2_grpc
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for


@pytest.fixture
async def slow_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """A central whose egress is capped, so a rollout takes seconds and can be interrupted."""
    server = CentralServer(central_settings(tmp_path / "central", origin={"egress_bytes_s": 1_000_000}))
    await server.start()
    yield server
    await server.stop()


async def test_stopping_an_owner_mid_rollout_still_completes_everywhere(
    slow_central: CentralServer, make_edge: EdgeFactory, model_file: Path
) -> None:
    edges = [await make_edge(f"edge-{i}", slow_central) for i in range(4)]
    async with httpx.AsyncClient(base_url=slow_central.http_url, timeout=30) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
    victim = edges[0]
    await wait_for(lambda: victim.edge.fetcher.stats.chunks_from_origin > 0, what="the victim fetching its chunks")
    assert version_state(victim, "mlp", "1") != "complete"
    owned_before = slow_central.central.placement.owned_by(victim.node_id)
    assert owned_before
    await victim.stop(unregister=False)  # its stream closes; central re-places its chunks

    survivors = edges[1:]
    await wait_for(
        lambda: victim.node_id not in {n.node_id for n in slow_central.central.directory.nodes()}, what="leave"
    )
    placement = slow_central.central.placement.placement(("mlp", "1"))
    assert all(victim.node_id not in owners for owners in placement.values())
    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in survivors), 60, "survivors")
    for edge in survivors:
        assert edge.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()


class LyingPeer(peer_pb2_grpc.PeerServicer):
    """A fleet member that answers every chunk request with wrong bytes."""

    def __init__(self) -> None:
        self.served = 0

    async def FetchChunk(self, request: peer_pb2.PeerFetchRequest, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        self.served += 1
        yield common_pb2.ChunkData(data=b"\x00" * min(request.size or CHUNK_PIECE_BYTES, CHUNK_PIECE_BYTES))

    async def HasChunks(self, request: peer_pb2.HasChunksRequest, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        return peer_pb2.HasChunksReply(present=list(request.digests))


async def _join_as_rogue(central: CentralServer, servicer: LyingPeer) -> tuple[grpc.aio.Server, asyncio.Task[None]]:
    server = grpc.aio.server()
    peer_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(central.grpc_address)
    stub = registry_pb2_grpc.RegistryStub(channel)
    node = registry_pb2.NodeInfo(node_id="rogue", grpc_address=f"127.0.0.1:{port}", capacity=3)
    await stub.Register(registry_pb2.RegisterRequest(node=node))

    async def hold_stream() -> None:
        try:
            async for _ in stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="rogue")):
                pass
        finally:
            await channel.close()

    return server, asyncio.create_task(hold_stream())


async def test_an_edge_rejects_a_peer_that_serves_corrupted_bytes_and_still_finishes(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path
) -> None:
    liar = LyingPeer()
    rogue_server, stream = await _join_as_rogue(central, liar)
    try:
        edges = [await make_edge(f"edge-{i}", central) for i in range(2)]
        await wait_for(lambda: len(central.central.directory.nodes()) == 3, what="rogue and two edges registered")
        response = await push(api, "mlp", model_file)
        assert response.status_code == 201
        digests = {c["digest"] for c in response.json()["manifest"]["chunks"]}
        await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), 60, "rollout")
        for edge in edges:
            assert edge.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
        assert liar.served > 0
        assert sum(e.edge.fetcher.stats.rejected_corrupt["rogue"] for e in edges) == liar.served
        for edge in edges:  # every cached chunk matches its digest (get() re-verifies)
            assert all(edge.edge.store.get(d) is not None for d in digests)
            assert edge.edge.store.stats().entries == len(digests)
    finally:
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
        await rogue_server.stop(None)


async def test_a_restarted_edge_fetches_nothing_it_already_had(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    first = await make_edge("edge-0", central, data_dir=tmp_path / "edge-0")
    other = await make_edge("edge-1", central)
    assert (await push(api, "mlp", model_file)).status_code == 201
    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in (first, other)), what="rollout")
    await first.stop()

    # Same data dir (cache and versions): it comes back complete without a byte fetched.
    again = await make_edge("edge-0", central, data_dir=tmp_path / "edge-0")
    await wait_for(lambda: version_state(again, "mlp", "1") == "complete", what="restart")
    await wait_for(lambda: again.edge.repository.ready(), what="the restarted edge serving again")
    assert again.edge.fetcher.stats.as_dict()["bytes_fetched"] == 0
    await again.stop()

    # Lose the assembled file but keep the cache: it reassembles from cached chunks only.
    again.edge.files.remove("mlp", "1")
    third = await make_edge("edge-0", central, data_dir=tmp_path / "edge-0")
    await wait_for(lambda: version_state(third, "mlp", "1") == "complete", what="reassembly")
    assert third.edge.fetcher.stats.as_dict()["bytes_fetched"] == 0
    assert third.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()


async def test_an_edge_stopped_mid_fetch_resumes_with_only_the_missing_chunks(
    slow_central: CentralServer, make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    edge = await make_edge("edge-0", slow_central, data_dir=tmp_path / "edge-0")
    async with httpx.AsyncClient(base_url=slow_central.http_url, timeout=30) as api:
        response = await push(api, "mlp", model_file)
    size = response.json()["manifest"]["size"]
    await wait_for(lambda: edge.edge.fetcher.stats.bytes_from_origin > size // 3, what="a third fetched")
    await edge.stop()
    already = edge.edge.fetcher.stats.as_dict()["bytes_fetched"]
    assert 0 < already < size

    resumed = await make_edge("edge-0", slow_central, data_dir=tmp_path / "edge-0")
    await wait_for(lambda: version_state(resumed, "mlp", "1") == "complete", 60, "resumed rollout")
    assert resumed.edge.fetcher.stats.as_dict()["bytes_fetched"] == size - already
    assert resumed.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
