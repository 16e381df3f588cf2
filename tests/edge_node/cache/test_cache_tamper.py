"""A tampered cache directory cannot make an edge hand out or load bytes central did not
publish: a chunk whose file was changed on disk fails its digest when read, is dropped
(counted), and fetched again, both when a peer asks for it and when a new version that
shares it is assembled; the edge then serves the published model."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.fleet import EdgeFactory, push, version_state
from support.metrics import metric_samples, sample
from support.wait import wait_for

REQUEST = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]}


def _tamper(edge: EdgeServer, chunk: bytes) -> Path:
    """Flip one byte of the file in which diskcache keeps ``chunk`` (every value is a file)."""
    root = edge.settings.resolved_cache_dir
    (path,) = [p for p in root.rglob("*.val") if p.read_bytes() == chunk]
    data = bytearray(chunk)
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


async def _peer_fetch(edge: EdgeServer, digest: str) -> bytes:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        call = peer_pb2_grpc.PeerStub(channel).FetchChunk(peer_pb2.PeerFetchRequest(digest=digest, requester="peer"))
        return b"".join([piece.data async for piece in call])


async def test_a_tampered_chunk_is_dropped_refetched_and_never_served_or_loaded(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    # No in-memory copies: every read of a chunk goes to the cache directory.
    edge = await make_edge("edge-0", central, fetch={"hot_cache_bytes": 0})
    published = small_model_file.read_bytes()
    chunks = (await push(api, "tiny", small_model_file)).json()["manifest"]["chunks"]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny 1 on the edge")
    assert len(chunks) == 1 and chunks[0]["size"] == len(published)
    digest = chunks[0]["digest"]
    from_origin = edge.edge.fetcher.stats.chunks_from_origin

    _tamper(edge, published)
    assert await _peer_fetch(edge, digest) == published  # dropped, fetched again, served right
    assert edge.edge.store.stats().corrupt_dropped == 1
    assert edge.edge.fetcher.stats.chunks_from_origin == from_origin + 1

    _tamper(edge, published)  # again, then a new version sharing the chunk is assembled from the cache
    assert (await push(api, "tiny", small_model_file, version="2")).status_code == 201
    await wait_for(lambda: version_state(edge, "tiny", "2") == "complete", what="tiny 2 assembled")
    assert edge.edge.files.model_path("tiny", "2").read_bytes() == published
    assert edge.edge.store.stats().corrupt_dropped == 2
    assert edge.edge.fetcher.stats.chunks_from_origin == from_origin + 2

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
        await wait_for(lambda: edge.edge.repository.ready(), what="tiny serving")
        v1 = await oip.post("/v2/models/tiny/versions/1/infer", json=REQUEST)
        v2 = await oip.post("/v2/models/tiny/versions/2/infer", json=REQUEST)
        assert v1.status_code == v2.status_code == 200, (v1.text, v2.text)
        assert v1.json()["outputs"][0]["data"] == v2.json()["outputs"][0]["data"]
        metrics = metric_samples((await oip.get("/metrics")).text)
    assert sample(metrics, "modelfleet_cache_corrupt_dropped_total") == 2


async def test_a_tampered_model_file_and_chunk_are_rebuilt_at_restart(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central, fetch={"hot_cache_bytes": 0})
    published = small_model_file.read_bytes()
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny 1 on the edge")
    model = edge.edge.files.model_path("tiny", "1")
    await edge.stop()

    tampered = bytearray(published)
    tampered[-10] ^= 0xFF
    model.write_bytes(bytes(tampered))  # the assembled file, marked complete, and its chunk
    _tamper(edge, published)

    again = await make_edge("edge-0", central, fetch={"hot_cache_bytes": 0})
    await wait_for(lambda: version_state(again, "tiny", "1") == "complete", what="tiny 1 rebuilt")
    assert model.read_bytes() == published
    assert again.edge.store.stats().corrupt_dropped == 1 and again.edge.fetcher.stats.chunks_from_origin == 1
    await wait_for(lambda: again.edge.repository.ready(), what="tiny serving")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{again.http_port}", timeout=30) as oip:
        assert (await oip.post("/v2/models/tiny/infer", json=REQUEST)).status_code == 200
