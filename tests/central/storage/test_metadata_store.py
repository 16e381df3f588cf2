"""The ``MetadataStore`` contract, each behaviour on SQLite and on PostgreSQL (a fresh
database on the session's private server): versions, sequence numbers, deletes,
references, reopening, a second store on the same database."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from central.storage.postgres.registry import PostgresMetadataStore
from central.storage.protocols import MetadataStore, VersionExists, utc_now
from central.storage.sqlite.registry import SQLiteMetadataStore
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec


def digest(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def manifest(name: str, version: str, chunks: list[str], **labels: str) -> Manifest:
    return Manifest(
        name=name,
        version=version,
        sha256=digest(f"file-{name}-{version}"),
        size=100 * len(chunks),
        chunks=[ChunkRef(digest=digest(c), size=100) for c in chunks],
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, 8])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 2])],
        created_at=utc_now(),
        labels=labels,
    )


#: Opens another store on the test's database (SQLite file or PostgreSQL database).
OpenStore = Callable[[], MetadataStore]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "meta" / "registry.sqlite3"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.fleet)])
def open_store(request: pytest.FixtureRequest, db_path: Path) -> Iterator[OpenStore]:
    """Opens stores of the backend under test on one database; all are closed at the end."""
    opened: list[MetadataStore] = []
    if request.param == "sqlite":
        make: OpenStore = lambda: SQLiteMetadataStore(db_path)  # noqa: E731
    else:
        url = request.getfixturevalue("postgres_url")
        make = lambda: PostgresMetadataStore(url)  # noqa: E731

    def factory() -> MetadataStore:
        opened.append(make())
        return opened[-1]

    yield factory
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: OpenStore) -> MetadataStore:
    return open_store()


def test_empty_store(store: MetadataStore) -> None:
    assert store.list_models() == []
    assert store.list_versions("m") == []
    assert store.get_version("m", "1") is None
    assert store.next_seq("m") == 1
    assert store.referenced_digests() == set()
    assert store.delete_version("m", "1") is False


def test_insert_and_read_back(store: MetadataStore) -> None:
    m = manifest("m", "1", ["a", "b"], team="vision")
    record = store.insert_version(m)
    assert (record.name, record.version, record.seq) == ("m", "1", 1)
    assert record.manifest == m
    got = store.get_version("m", "1")
    assert got is not None
    assert got.manifest == m
    assert got.manifest.labels == {"team": "vision"}
    assert got.seq == 1
    assert got.created_at == m.created_at


def test_sequence_numbers_and_listing_order(store: MetadataStore) -> None:
    assert store.next_seq("m") == 1
    for i, version in enumerate(["1", "rc", "zeta", "alpha"], start=1):
        assert store.insert_version(manifest("m", version, [version])).seq == i
        assert store.next_seq("m") == i + 1
    assert [(v.version, v.seq) for v in store.list_versions("m")] == [("1", 1), ("rc", 2), ("zeta", 3), ("alpha", 4)]
    # Sequence numbers are per model.
    assert store.next_seq("other") == 1
    assert store.insert_version(manifest("other", "x", ["x"])).seq == 1


def test_list_models_sorted_with_count_and_latest_by_seq(store: MetadataStore) -> None:
    store.insert_version(manifest("zeta", "1", ["a"]))
    store.insert_version(manifest("alpha", "b", ["a"]))
    store.insert_version(manifest("alpha", "a", ["b"]))  # later, though it sorts first
    models = store.list_models()
    assert [(m.name, m.versions, m.latest) for m in models] == [("alpha", 2, "a"), ("zeta", 1, "1")]
    assert all(m.created_at for m in models)


def test_duplicate_version_raises_and_changes_nothing(store: MetadataStore) -> None:
    original = manifest("m", "1", ["a"])
    store.insert_version(original)
    with pytest.raises(VersionExists):
        store.insert_version(manifest("m", "1", ["other"]))
    got = store.get_version("m", "1")
    assert got is not None and got.manifest == original
    assert len(store.list_versions("m")) == 1
    assert store.referenced_digests() == {digest("a")}
    # The store is still usable after the failed transaction.
    assert store.insert_version(manifest("m", "2", ["b"])).seq == 2


def test_delete_version(store: MetadataStore) -> None:
    store.insert_version(manifest("m", "1", ["a"]))
    store.insert_version(manifest("m", "2", ["b"]))
    assert store.delete_version("m", "1") is True
    assert store.get_version("m", "1") is None
    assert [v.version for v in store.list_versions("m")] == ["2"]
    assert store.delete_version("m", "1") is False
    assert store.next_seq("m") == 3, "sequence numbers are not reused after deleting an older version"
    assert [(m.name, m.versions, m.latest) for m in store.list_models()] == [("m", 1, "2")]


def test_deleting_the_last_version_removes_the_model(store: MetadataStore) -> None:
    store.insert_version(manifest("m", "1", ["a"]))
    assert store.delete_version("m", "1") is True
    assert store.list_models() == []
    # The name can be used again from scratch.
    assert store.insert_version(manifest("m", "1", ["a"])).seq == 1


def test_referenced_digests_is_the_union_over_all_versions(store: MetadataStore) -> None:
    store.insert_version(manifest("m", "1", ["a", "b", "a"]))
    store.insert_version(manifest("m", "2", ["b", "c"]))
    store.insert_version(manifest("n", "1", ["d"]))
    assert store.referenced_digests() == {digest(x) for x in "abcd"}
    store.delete_version("m", "1")
    assert store.referenced_digests() == {digest(x) for x in "bcd"}
    store.delete_version("n", "1")
    assert store.referenced_digests() == {digest(x) for x in "bc"}


def test_reopen_after_close_keeps_data(open_store: OpenStore) -> None:
    first = open_store()
    m1 = manifest("m", "1", ["a"], k="v")
    first.insert_version(m1)
    first.insert_version(manifest("m", "2", ["b"]))
    first.delete_version("m", "2")
    first.close()

    again = open_store()
    got = again.get_version("m", "1")
    assert got is not None and got.manifest == m1
    assert [v.version for v in again.list_versions("m")] == ["1"]
    assert again.next_seq("m") == 2
    assert again.referenced_digests() == {digest("a")}
    with pytest.raises(VersionExists):
        again.insert_version(manifest("m", "1", ["z"]))


def test_artifacts_and_replaced_manifests_read_back(store: MetadataStore) -> None:
    served = manifest("m", "1", ["a"])
    fp32 = manifest("m", "1", ["f", "g"]).model_copy(update={"artifact": "fp32"})
    record = store.insert_version(served, {served.artifact: served, "fp32": fp32})
    assert set(record.artifacts) == {served.artifact, "fp32"}
    got = store.get_version("m", "1")
    assert got is not None and got.artifacts == {served.artifact: served, "fp32": fp32}
    assert store.referenced_digests() == {digest(x) for x in "afg"}
    # Without artifacts the served manifest is the only one.
    store.insert_version(manifest("m", "2", ["b"]))
    only = store.get_version("m", "2")
    assert only is not None and list(only.artifacts.values()) == [only.manifest]

    labelled = served.model_copy(update={"labels": {"signed": "yes"}})
    store.replace_manifests(labelled, {served.artifact: labelled})
    again = store.get_version("m", "1")
    assert again is not None and again.manifest.labels == {"signed": "yes"}
    assert again.artifacts == {served.artifact: labelled} and again.seq == 1
    assert store.referenced_digests() == {digest(x) for x in "ab"}


def test_committed_version_is_visible_to_another_store(open_store: OpenStore) -> None:
    first, second = open_store(), open_store()
    first.insert_version(manifest("m", "1", ["a"]))
    got = second.get_version("m", "1")
    assert got is not None and got.seq == 1
    assert second.next_seq("m") == 2


def test_sqlite_store_is_in_wal_mode(db_path: Path) -> None:
    store = SQLiteMetadataStore(db_path)
    store.insert_version(manifest("m", "1", ["a"]))
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("SELECT name, version, seq FROM versions").fetchall() == [("m", "1", 1)]
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        other.close()
        store.close()
