"""ChunkStore: content addressing, LRU eviction, per-holder pins, sharing."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import diskcache
import pytest

from edge_node.cache import CacheStats, ChunkStore, CorruptChunk
from fleetwire.digest import chunk_digest

KIB = 1024
CHUNK = 64 * KIB
LIMIT = 256 * KIB  # exactly four chunks


def make_chunk(size: int = CHUNK) -> tuple[str, bytes]:
    data = os.urandom(size)
    return chunk_digest(data), data


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChunkStore]:
    s = ChunkStore(tmp_path, size_limit=LIMIT, holder="node-a")
    yield s
    s.close()


def fill(store: ChunkStore, count: int) -> list[str]:
    digests = []
    for _ in range(count):
        digest, data = make_chunk()
        assert store.put(digest, data)
        digests.append(digest)
    return digests


def test_put_get_roundtrip(store: ChunkStore) -> None:
    digest, data = make_chunk()
    assert store.put(digest, data) is True
    assert store.get(digest) == data
    assert store.has(digest)
    assert store.put(digest, data) is False  # already there, no rewrite
    other, _ = make_chunk()
    assert store.has_many([digest, other]) == {digest}
    assert store.stats().entries == 1
    assert store.stats().bytes == CHUNK


def test_small_and_empty_chunks(store: ChunkStore) -> None:
    for size in (0, 1, 100):
        digest, data = make_chunk(size)
        assert store.put(digest, data)
        assert store.get(digest) == data


def test_corrupt_put_raises_and_stores_nothing(store: ChunkStore) -> None:
    digest, data = make_chunk()
    with pytest.raises(CorruptChunk):
        store.put(digest, data + b"x")
    assert not store.has(digest)
    stats = store.stats()
    assert (stats.entries, stats.bytes, stats.bytes_written) == (0, 0, 0)


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "g" * 64, "0" * 63])
def test_malformed_digest_rejected(store: ChunkStore, bad: str) -> None:
    with pytest.raises(ValueError):
        store.get(bad)
    with pytest.raises(ValueError):
        store.has(bad)
    with pytest.raises(ValueError):
        store.put(bad, b"")
    with pytest.raises(ValueError):
        store.set_pins([bad])


def test_second_instance_sees_put(tmp_path: Path, store: ChunkStore) -> None:
    digest, data = make_chunk()
    store.put(digest, data)
    with ChunkStore(tmp_path, size_limit=LIMIT, holder="node-b") as other:
        assert other.get(digest) == data
        assert other.put(digest, data) is False


def _child_put_and_pin(directory: str, data: bytes) -> None:
    with ChunkStore(Path(directory), size_limit=LIMIT, holder="child") as s:
        digest = chunk_digest(data)
        assert s.put(digest, data)
        s.set_pins([digest])


def test_cross_process_put_and_pins(tmp_path: Path, store: ChunkStore) -> None:
    digest, data = make_chunk()
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_child_put_and_pin, args=(str(tmp_path), data))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert store.get(digest) == data
    assert store.pinned() == set()  # the child's pins are not ours
    fill(store, 6)  # eviction pressure from this process
    assert store.get(digest) == data  # the child's pin protects it
    assert store.stats().pinned_bytes == CHUNK


def test_lru_evicts_least_recently_used_first(store: ChunkStore) -> None:
    a, b, c, d = fill(store, 4)
    assert store.stats().evictions == 0
    assert store.get(a) is not None  # a is now more recent than b
    (e,) = fill(store, 1)
    assert store.has_many([a, b, c, d, e]) == {a, c, d, e}
    stats = store.stats()
    assert stats.evictions == 1
    assert stats.bytes == LIMIT


def test_has_does_not_refresh_lru(store: ChunkStore) -> None:
    a, b, _, _ = fill(store, 4)
    assert store.has(a)
    fill(store, 1)
    assert not store.has(a)
    assert store.has(b)


def test_pinned_survive_eviction_pressure(store: ChunkStore) -> None:
    a, b = fill(store, 2)
    store.set_pins([a, b])
    fill(store, 10)
    assert store.has(a) and store.has(b)
    stats = store.stats()
    assert stats.pinned_bytes == 2 * CHUNK
    assert stats.bytes <= LIMIT
    assert store.pinned() == {a, b}


def test_pins_over_capacity_do_not_crash(store: ChunkStore) -> None:
    digests = [make_chunk() for _ in range(5)]
    store.set_pins([d for d, _ in digests])
    for digest, data in digests:
        assert store.put(digest, data)
    stats = store.stats()
    assert stats.bytes == 5 * CHUNK > stats.capacity
    (loose,) = fill(store, 1)  # no room for anything unpinned
    assert not store.has(loose)
    store.set_pins([])
    stats = store.stats()
    assert stats.pinned_bytes == 0
    assert stats.bytes == LIMIT


def test_unpinning_makes_evictable(store: ChunkStore) -> None:
    (a,) = fill(store, 1)
    store.set_pins([a])
    fill(store, 6)
    assert store.has(a)
    store.set_pins([])
    assert store.has(a)  # unpinning alone doesn't drop it
    fill(store, 4)
    assert not store.has(a)


def test_two_holders_pin_independently(tmp_path: Path, store: ChunkStore) -> None:
    (x,) = fill(store, 1)
    with ChunkStore(tmp_path, size_limit=LIMIT, holder="node-b") as other:
        store.set_pins([x])
        other.set_pins([x])
        store.set_pins([])
        assert store.pinned() == set()
        assert other.pinned() == {x}
        fill(store, 6)
        assert store.has(x)
        other.set_pins([])
        fill(store, 4)
        assert not store.has(x)


def test_pin_before_arrival(store: ChunkStore) -> None:
    digest, data = make_chunk()
    store.set_pins([digest])
    assert store.pinned() == {digest}
    assert store.stats().pinned_bytes == 0
    assert store.put(digest, data)
    assert store.stats().pinned_bytes == CHUNK
    fill(store, 8)
    assert store.get(digest) == data


def test_counters(store: ChunkStore) -> None:
    digest, data = make_chunk()
    missing, _ = make_chunk()
    store.put(digest, data)
    store.put(digest, data)  # not accepted again
    store.get(digest)
    store.get(digest)
    store.get(missing)
    store.has(missing)  # no counters
    fill(store, 4)
    assert store.stats() == CacheStats(
        bytes=LIMIT,
        capacity=LIMIT,
        pinned_bytes=0,
        entries=4,
        hits=2,
        misses=1,
        bytes_read=2 * CHUNK,
        bytes_written=5 * CHUNK,
        evictions=1,
    )


def _tamper_only_value_file(root: Path) -> None:
    (path,) = root.rglob("*.val")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("pinned", [False, True])
def test_corruption_on_disk_detected(tmp_path: Path, store: ChunkStore, pinned: bool) -> None:
    digest, data = make_chunk()
    store.put(digest, data)
    if pinned:
        store.set_pins([digest])
    _tamper_only_value_file(tmp_path / ("pinned" if pinned else "lru"))
    assert store.get(digest) is None
    assert not store.has(digest)
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.bytes) == (0, 1, 0, 0)
    assert not list(tmp_path.rglob("*.val"))
    assert store.put(digest, data)  # can be fetched again
    assert store.get(digest) == data


def test_reopen_with_smaller_limit_evicts(tmp_path: Path, store: ChunkStore) -> None:
    fill(store, 4)
    store.close()
    with ChunkStore(tmp_path, size_limit=2 * CHUNK, holder="node-a") as smaller:
        assert smaller.stats().bytes == 2 * CHUNK


def test_reconcile_after_crash_mid_move(tmp_path: Path, store: ChunkStore) -> None:
    digest, data = make_chunk()
    store.set_pins([digest])
    store.put(digest, data)
    store.close()
    # Simulate a crash that left the chunk in lru/ although it is pinned.
    settings = {"cull_limit": 0, "disk_min_file_size": 0}
    pinned = diskcache.Cache(str(tmp_path / "pinned"), eviction_policy="none", **settings)
    with pinned:
        assert pinned.delete(digest)
    lru = diskcache.Cache(str(tmp_path / "lru"), eviction_policy="least-recently-used", **settings)
    with lru:
        assert lru.add(digest, data)
    with ChunkStore(tmp_path, size_limit=LIMIT, holder="node-a") as reopened:
        assert reopened.stats().pinned_bytes == CHUNK
        fill(reopened, 6)
        assert reopened.get(digest) == data


def _child_churn(directory: str, holder: str, chunks: list[bytes]) -> None:
    with ChunkStore(Path(directory), size_limit=LIMIT, holder=holder) as s:
        digests = [chunk_digest(c) for c in chunks]
        for i, data in enumerate(chunks):
            s.set_pins(digests[: i + 1])
            s.put(digests[i], data)
            fill(s, 2)  # eviction pressure racing the other processes


def test_concurrent_processes_keep_each_others_pins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    plan = {f"h{n}": [os.urandom(4 * KIB) for _ in range(5)] for n in range(3)}
    procs = [ctx.Process(target=_child_churn, args=(str(tmp_path), holder, chunks)) for holder, chunks in plan.items()]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    for holder, chunks in plan.items():
        with ChunkStore(tmp_path, size_limit=LIMIT, holder=holder) as s:
            assert s.pinned() == {chunk_digest(c) for c in chunks}
            assert all(s.get(chunk_digest(c)) == c for c in chunks)
            assert s.stats().bytes <= LIMIT
