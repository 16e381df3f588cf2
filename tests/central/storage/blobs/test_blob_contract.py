"""The ``ChunkBlobs`` contract, run against the directory store and an S3 bucket on a real
S3 server process (``modelfleet/up/s3server.py``)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from central.settings import BlobSettings, CentralSettings
from central.storage.blobs.local import BlobStore
from central.storage.blobs.s3 import S3BlobStore
from central.storage.factory import open_blobs
from central.storage.protocols import ChunkBlobs, CorruptBlob
from modelfleet.up.s3server import S3Server

#: (store, write raw bytes under a key as someone tampering with the storage would)
Backend = tuple[ChunkBlobs, Callable[[str, bytes], None]]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _directory(tmp_path: Path, grace_s: float) -> Backend:
    store = BlobStore(tmp_path / "blobs", grace_s=grace_s)
    return store, lambda digest, data: store.path(digest).write_bytes(data)


def _s3(s3_server: S3Server, grace_s: float) -> Backend:
    bucket = s3_server.new_bucket()
    store = open_blobs(BlobSettings(**s3_server.blob_settings(bucket, prefix="fleet/", gc_grace_s=grace_s)), Path())
    assert isinstance(store, S3BlobStore)
    client = s3_server.client()
    return store, lambda digest, data: client.put_object(Bucket=bucket, Key=store.key(digest), Body=data)


@pytest.fixture(params=["directory", pytest.param("s3", marks=pytest.mark.fleet)])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[float], Backend]:
    def make(grace_s: float = 0.0) -> Backend:
        if request.param == "directory":
            return _directory(tmp_path, grace_s)
        return _s3(request.getfixturevalue("s3_server"), grace_s)

    return make


def test_put_stores_under_the_digest_once(make_backend: Callable[[float], Backend]) -> None:
    store, _ = make_backend(0.0)
    data = os.urandom(100_000)
    assert store.put(data) == (sha(data), True)
    assert store.put(data) == (sha(data), False)
    assert store.has(sha(data))
    assert store.read(sha(data)) == data
    assert store.put(b"") == (sha(b""), True)
    assert store.read(sha(b"")) == b""


def test_unknown_and_malformed_digests(make_backend: Callable[[float], Backend]) -> None:
    store, _ = make_backend(0.0)
    assert not store.has(sha(b"never stored"))
    with pytest.raises(FileNotFoundError):
        store.read(sha(b"never stored"))
    with pytest.raises(ValueError, match="not a sha256 digest"):
        store.has("../../etc/passwd")
    assert store.delete(sha(b"never stored")) is False


def test_digests_usage_and_delete(make_backend: Callable[[float], Backend]) -> None:
    store, _ = make_backend(0.0)
    blobs = [b"a" * 10, b"b" * 20, b"c" * 30]
    for data in blobs:
        store.put(data)
    assert sorted(store.digests()) == sorted(sha(d) for d in blobs)
    assert store.usage() == (3, 60)
    assert store.delete(sha(blobs[0])) is True
    assert not store.has(sha(blobs[0]))
    assert store.usage() == (2, 50)
    assert store.remove_temp_files() == 0


def test_a_blob_younger_than_the_grace_period_is_not_deleted(make_backend: Callable[[float], Backend]) -> None:
    store, _ = make_backend(3600.0)
    digest, _ = store.put(b"just pushed by another central")
    assert store.delete(digest) is False
    assert store.has(digest)


def test_a_corrupt_blob_is_never_read(make_backend: Callable[[float], Backend]) -> None:
    store, tamper = make_backend(0.0)
    digest, _ = store.put(b"the real chunk")
    tamper(digest, b"the real chunK")
    with pytest.raises(CorruptBlob, match=digest[:12]):
        store.read(digest)


def test_s3_put_renews_an_old_blob_so_a_concurrent_gc_keeps_it(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    store = open_blobs(BlobSettings(**s3_server.blob_settings(bucket, gc_grace_s=2.0)), Path())
    assert isinstance(store, S3BlobStore)
    client = s3_server.client()
    digest, _ = store.put(b"reused by a later push")
    key = store.key(digest)
    before = client.head_object(Bucket=bucket, Key=key)["LastModified"]
    time.sleep(1.1)  # past half the grace period: the next put uploads again
    assert store.put(b"reused by a later push") == (digest, False)
    after = client.head_object(Bucket=bucket, Key=key)["LastModified"]
    assert after > before
    assert store.delete(digest) is False, "renewed, so inside the grace period again"


def test_the_blobs_section_reads_the_environment_and_keeps_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_BLOBS__BUCKET", "fleet-chunks")
    monkeypatch.setenv("MODELFLEET_BLOBS__S3_ENDPOINT", "http://seaweedfs:8333")
    monkeypatch.setenv("MODELFLEET_BLOBS__ACCESS_KEY", "central")
    monkeypatch.setenv("MODELFLEET_BLOBS__SECRET_KEY", "s3cret")
    blobs = CentralSettings().blobs
    assert (blobs.bucket, blobs.s3_endpoint) == ("fleet-chunks", "http://seaweedfs:8333")
    assert blobs.secret_key is not None and blobs.secret_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(blobs)


def test_no_bucket_means_the_local_directory(tmp_path: Path) -> None:
    assert isinstance(open_blobs(BlobSettings(), tmp_path / "blobs"), BlobStore)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bucket": "b", "access_key": "only-the-id"}, "access_key and blobs.secret_key go together"),
        ({"s3_endpoint": "http://127.0.0.1:9000"}, "need blobs.bucket"),
    ],
)
def test_an_incomplete_blobs_section_fails_at_start_up(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CentralSettings(blobs=fields)


def test_a_bucket_without_keys_or_endpoint_uses_the_default_chain_and_aws() -> None:
    store = open_blobs(BlobSettings(bucket="fleet-chunks", prefix="/prod/"), Path())
    assert isinstance(store, S3BlobStore)
    assert store.key("a" * 64) == f"prod/sha256/aa/{'a' * 64}"
