"""Central's queue limits on real servers: pushes beyond ``max_concurrent_uploads`` get
503 with ``Retry-After`` before their body is read, and origin chunk streams beyond
``origin.max_concurrent_streams`` plus ``origin.max_waiting_streams`` are refused with
RESOURCE_EXHAUSTED, which an edge treats as retryable; after each burst, normal requests
succeed again (no slot leaks)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.digest import CHUNK_PIECE_BYTES
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for

#: Central's default chunking (about 1 MiB chunks), so a chunk spans several pieces.
DEFAULT_CHUNKS = {"avg_bytes": 1024 * 1024, "min_bytes": 256 * 1024, "max_bytes": 4 * 1024 * 1024}


async def _held(data: bytes, release: asyncio.Event) -> AsyncIterator[bytes]:
    yield data[:1024]
    await release.wait()
    yield data[1024:]


async def _push_once_free(api: httpx.AsyncClient, model: Path) -> httpx.Response:
    """A streamed push, retried while refused (the slot is given back as the aborted
    request unwinds); a slot that never comes back fails the test."""
    deadline = asyncio.get_running_loop().time() + 5
    while (response := await push(api, "third", model, progress="ndjson")).status_code == 503:
        assert asyncio.get_running_loop().time() < deadline, "the aborted push kept its upload slot"
        await asyncio.sleep(0.05)
    return response


async def test_pushes_beyond_max_concurrent_uploads_get_503_with_retry_after(
    tmp_path: Path, small_model_file: Path
) -> None:
    server = CentralServer(central_settings(tmp_path / "central", max_concurrent_uploads=1))
    await server.start()
    staging = server.central.staging.root
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as api:
            release = asyncio.Event()
            url = "/api/v1/models/tiny/versions"
            first = asyncio.create_task(api.post(url, content=_held(small_model_file.read_bytes(), release)))
            await wait_for(lambda: any(staging.glob("upload-*")), 10, "the first push staging its body")

            refused = await push(api, "other", small_model_file)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "5"
            assert "max_concurrent_uploads=1" in refused.json()["error"]
            assert len(list(staging.glob("upload-*"))) == 1  # the refused body was never staged

            release.set()
            assert (await first).status_code == 201
            assert (await push(api, "other", small_model_file)).status_code == 201  # the slot came back

            # A client that goes away mid-body gives its slot back too.
            gone = asyncio.create_task(api.post(url, content=_held(small_model_file.read_bytes(), asyncio.Event())))
            await wait_for(lambda: any(staging.glob("upload-*")), 10, "a push staging its body")
            gone.cancel()
            await wait_for(lambda: not list(staging.iterdir()), 10, "the abandoned upload removed")
            assert (await _push_once_free(api, small_model_file)).status_code == 200
    finally:
        await server.stop()


async def _read_all(call: grpc.aio.UnaryStreamCall) -> bytes:  # type: ignore[type-arg]
    return b"".join([piece.data async for piece in call])


async def test_origin_streams_beyond_the_waiting_queue_get_resource_exhausted(
    tmp_path: Path, model_file: Path, small_model_file: Path
) -> None:
    # 128 KiB/s after a 256 KiB burst: a chunk of more than one piece holds its slot for seconds.
    origin = {"egress_bytes_s": 128 * 1024, "max_concurrent_streams": 1, "max_waiting_streams": 1}
    server = CentralServer(central_settings(tmp_path / "central", chunking=DEFAULT_CHUNKS, origin=origin))
    await server.start()
    service = server.central.origin
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as api:
            big = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
            tiny = (await push(api, "tiny", small_model_file)).json()["manifest"]["chunks"]
        largest = max(big, key=lambda c: c["size"])
        assert largest["size"] > CHUNK_PIECE_BYTES and len(tiny) == 1

        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            stub = registry_pb2_grpc.RegistryStub(channel)

            def fetch(digest: str) -> grpc.aio.UnaryStreamCall:  # type: ignore[type-arg]
                return stub.FetchChunk(registry_pb2.OriginFetchRequest(digest=digest, node_id="edge-a"))

            sending = fetch(largest["digest"])
            assert len((await sending.read()).data) == CHUNK_PIECE_BYTES  # holds the only slot now
            waiting = fetch(largest["digest"])
            await wait_for(lambda: service.waiting == 1, 5, "a second stream waiting for the slot")

            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _read_all(fetch(tiny[0]["digest"]))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "origin.max_waiting_streams" in (refused.value.details() or "")
            assert service.stats.overloaded == 1

            sending.cancel()
            waiting.cancel()
            await wait_for(lambda: service.active == 0 and service.waiting == 0, 5, "slots given back")
            data = await _read_all(fetch(tiny[0]["digest"]))
            assert hashlib.sha256(data).hexdigest() == tiny[0]["digest"]
    finally:
        await server.stop()


async def test_an_edge_refused_by_a_full_origin_retries_and_completes(
    tmp_path: Path, model_file: Path, make_edge: EdgeFactory
) -> None:
    # No waiting line at all: every stream beyond the one slot is refused at once.
    origin = {"max_concurrent_streams": 1, "max_waiting_streams": 0}
    server = CentralServer(central_settings(tmp_path / "central", origin=origin))
    await server.start()
    edge = await make_edge("edge-0", server)
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as api:
            assert (await push(api, "mlp", model_file)).status_code == 201
        await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", 30, "the edge holding mlp 1")
        assert server.central.origin.stats.overloaded > 0  # it was refused, and retried
        assert edge.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
    finally:
        await edge.stop()
        await server.stop()
