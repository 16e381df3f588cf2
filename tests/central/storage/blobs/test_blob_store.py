"""BlobStore: content-addressed chunk files, atomic writes, crash leftovers."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from central.storage.blobs import local as blobs_module
from central.storage.blobs.local import BlobStore, atomic_write


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_put_stores_under_the_digest_and_reads_back(store: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    digest, created = store.put(data)
    assert digest == sha(data)
    assert created is True
    path = tmp_path / "blobs" / "sha256" / digest[:2] / digest
    assert store.path(digest) == path
    assert path.read_bytes() == data
    assert store.has(digest)
    assert store.read(digest) == data
    assert store.size(digest) == len(data)


def test_put_is_idempotent(store: BlobStore, tmp_path: Path) -> None:
    data = b"the same bytes twice"
    first = store.put(data)
    before = store.path(first[0]).stat()
    second = store.put(data)
    assert first == (sha(data), True)
    assert second == (sha(data), False)
    after = store.path(first[0]).stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns), "not rewritten"
    assert all_files(tmp_path / "blobs") == [store.path(first[0])]


def test_distinct_blobs_and_empty_blob(store: BlobStore) -> None:
    a, _ = store.put(b"a")
    b, _ = store.put(b"b")
    empty, created = store.put(b"")
    assert len({a, b, empty}) == 3
    assert created
    assert store.read(empty) == b""
    assert store.read(a) == b"a" and store.read(b) == b"b"


def test_has_is_false_for_unknown_digest(store: BlobStore) -> None:
    assert not store.has(sha(b"never stored"))


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "A" * 64, "g" * 64, "0" * 63, "0" * 65, "../" + "0" * 61, "00/" + "0" * 61],
)
def test_path_rejects_anything_but_a_lowercase_sha256(store: BlobStore, bad: str) -> None:
    with pytest.raises(ValueError):
        store.path(bad)
    with pytest.raises(ValueError):
        store.has(bad)


def test_iter_pieces_streams_the_whole_blob(store: BlobStore) -> None:
    data = os.urandom(200_001)
    digest, _ = store.put(data)
    pieces = list(store.iter_pieces(digest, piece=65536))
    assert [len(p) for p in pieces] == [65536, 65536, 65536, 200_001 - 3 * 65536]
    assert b"".join(pieces) == data


def test_read_of_missing_blob_raises(store: BlobStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.read(sha(b"missing"))


def test_remove_temp_files_deletes_only_crash_leftovers(store: BlobStore, tmp_path: Path) -> None:
    kept, _ = store.put(b"a real blob")
    shard = store.path(kept).parent
    leftovers = [shard / ".tmp-abc123", tmp_path / "blobs" / "sha256" / "ff" / ".tmp-zzz"]
    for p in leftovers:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a chunk")
    assert store.remove_temp_files() == 2
    assert not any(p.exists() for p in leftovers)
    assert store.read(kept) == b"a real blob"
    assert store.remove_temp_files() == 0


def test_reopening_a_store_keeps_blobs(tmp_path: Path) -> None:
    digest, _ = BlobStore(tmp_path / "blobs").put(b"durable")
    again = BlobStore(tmp_path / "blobs")
    assert again.has(digest)
    assert again.put(b"durable") == (digest, False)


def test_failed_write_leaves_no_temp_file_and_no_blob(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(blobs_module.os, "replace", broken_replace)
    data = b"never lands"
    with pytest.raises(OSError, match="disk on fire"):
        store.put(data)
    monkeypatch.undo()
    assert not store.has(sha(data))
    assert all_files(tmp_path / "blobs") == []


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "file"
    atomic_write(target, b"first version, long")
    atomic_write(target, b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["file"]
