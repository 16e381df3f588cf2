"""The Peer service of a real edge: what it holds, what it refuses."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.fleet import EdgeFactory, push, version_state
from support.wait import wait_for


async def test_peer_serves_held_chunks_and_refuses_unknown_ones(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central)
    manifest = (await push(api, "tiny", small_model_file)).json()["manifest"]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="rollout")
    digests = [c["digest"] for c in manifest["chunks"]]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        reply = await stub.HasChunks(peer_pb2.HasChunksRequest(digests=[*digests, "f" * 64]))
        assert list(reply.present) == digests
        data = b"".join(
            [p.data async for p in stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=digests[0], requester="x"))]
        )
        assert data == small_model_file.read_bytes()[: manifest["chunks"][0]["size"]]
        for digest, code in (("e" * 64, grpc.StatusCode.NOT_FOUND), ("nope", grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=digest, requester="x")):
                    pass
            assert err.value.code() == code


async def test_edge_status_endpoint_reports_versions_cache_and_fetches(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central)
    await push(api, "tiny", small_model_file)
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="rollout")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}") as client:
        status = (await client.get("/api/v1/status")).json()
        assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert status["node_id"] == "edge-0" and status["connected"] is True
    (version,) = status["versions"]
    assert version["state"] == "complete" and version["chunks_present"] == version["chunks_total"]
    assert status["fetch"]["bytes_from_origin"] == small_model_file.stat().st_size
    assert status["cache"]["pinned_bytes"] == small_model_file.stat().st_size
