"""A central whose chunks live in an S3 bucket (a real S3 server process): pushes land there,
edges fetch them through the origin, a restarted central still serves them, and a chunk
damaged in the bucket is never sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from central.errors import NotFound
from central.server import CentralServer
from central.storage.blobs.s3 import S3BlobStore
from modelfleet.up.s3server import S3Server
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for


async def test_chunks_in_s3_are_pushed_fetched_and_survive_a_restart(
    make_edge: EdgeFactory, model_file: Path, tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    settings = central_settings(tmp_path / "central", blobs=s3_server.blob_settings(bucket, prefix="fleet"))
    first = CentralServer(settings)
    await first.start()
    try:
        async with httpx.AsyncClient(base_url=first.http_url) as api:
            assert (await push(api, "mlp", model_file)).status_code == 201
        stored = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="fleet/sha256/")
        assert stored["KeyCount"] > 10, "the chunks are in the bucket"
        assert not (tmp_path / "central" / "blobs").exists(), "and not on central's disk"
        edge = await make_edge("edge-a", first)
        await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", what="first edge")
        assert edge.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
        await edge.stop()
    finally:
        await first.stop()

    second = CentralServer(settings)
    await second.start()
    try:
        late = await make_edge("edge-b", second)
        await wait_for(lambda: version_state(late, "mlp", "1") == "complete", what="edge after the restart")
        assert late.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
    finally:
        await second.stop()


async def test_a_chunk_damaged_in_the_bucket_is_never_sent(
    small_model_file: Path, tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    server = CentralServer(central_settings(tmp_path / "central", blobs=s3_server.blob_settings(bucket)))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url) as api:
            assert (await push(api, "tiny", small_model_file)).status_code == 201
        blobs = server.central.blobs
        assert isinstance(blobs, S3BlobStore)
        digest = next(iter(blobs.digests()))
        s3_server.client().put_object(Bucket=bucket, Key=blobs.key(digest), Body=b"not the chunk")
        with pytest.raises(NotFound, match="corrupt"):
            async for _ in server.central.origin.stream(digest, "edge-x", ()):
                pass
    finally:
        await server.stop()
