"""What only PostgreSQL has to get right: replicas migrating and pushing at the same time,
a central on ``store.url`` that keeps its registry across a restart, and a password that
never reaches the logs."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import psycopg
import pytest
from pydantic import ValidationError

from central.server import CentralServer
from central.settings import CentralSettings
from central.storage.postgres.migrate import apply_migrations, bundled_migrations
from central.storage.postgres.registry import PostgresMetadataStore, StoreUnavailable, masked_url
from central.storage.protocols import utc_now
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec
from support.fleet import central_settings, push

T = TypeVar("T")


def manifest(name: str, version: str, chunks: list[str]) -> Manifest:
    """A small manifest whose chunks are named by ``chunks``."""
    return Manifest(
        name=name,
        version=version,
        sha256=hashlib.sha256(f"{name}-{version}".encode()).hexdigest(),
        size=100 * len(chunks),
        chunks=[ChunkRef(digest=hashlib.sha256(c.encode()).hexdigest(), size=100) for c in chunks],
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, 8])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 2])],
        created_at=utc_now(),
    )


def at_once(n: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` for i in range(n) on n threads released together."""
    barrier = threading.Barrier(n)

    def run(i: int) -> T:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_replicas_migrating_at_once_apply_each_migration_once(postgres_url: str) -> None:
    def migrate(_: int) -> list[str]:
        with psycopg.connect(postgres_url) as conn:
            return apply_migrations(conn)

    results = at_once(4, migrate)
    expected = [m.version for m in bundled_migrations()]
    assert sorted(results, key=len) == [[], [], [], expected], "exactly one replica applies the migrations"
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [r[0] for r in rows] == expected


def test_stores_opening_at_once_share_one_schema(postgres_url: str) -> None:
    stores = at_once(3, lambda _: PostgresMetadataStore(postgres_url))
    try:
        stores[0].insert_version(manifest("m", "1", ["a"]))
        assert all(s.next_seq("m") == 2 for s in stores)
        with psycopg.connect(postgres_url) as conn:
            (count,) = conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone() or (0,)
        assert count == len(bundled_migrations())
    finally:
        for s in stores:
            s.close()


def test_replicas_pushing_one_model_at_once_get_distinct_sequence_numbers(postgres_url: str) -> None:
    stores = [PostgresMetadataStore(postgres_url) for _ in range(2)]
    try:
        seqs = at_once(8, lambda i: stores[i % 2].insert_version(manifest("m", f"v{i}", [str(i)])).seq)
        assert sorted(seqs) == list(range(1, 9))
        assert [v.seq for v in stores[0].list_versions("m")] == list(range(1, 9))
    finally:
        for s in stores:
            s.close()


def test_masked_url_hides_only_the_password() -> None:
    assert masked_url("postgresql://fleet:s3cr%40t@db.example:5433/reg") == "postgresql://fleet:***@db.example:5433/reg"
    assert masked_url("postgresql://fleet@db/reg") == "postgresql://fleet@db/reg"


def test_store_url_must_be_postgresql_and_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="postgresql://"):
        CentralSettings(data_dir=tmp_path, store={"url": "mysql://x@y/z"})
    assert CentralSettings(data_dir=tmp_path).store.url is None, "SQLite unless asked"
    monkeypatch.setenv("MODELFLEET_STORE__URL", "postgresql://fleet:pw@db:5432/reg")
    assert CentralSettings(data_dir=tmp_path).store.url == "postgresql://fleet:pw@db:5432/reg"


def test_a_wrong_password_fails_start_up_with_the_url_masked(postgres_url: str) -> None:
    parts = psycopg.conninfo.conninfo_to_dict(postgres_url)
    wrong = postgres_url.replace(f":{parts['password']}@", ":not-the-password@")
    assert wrong != postgres_url
    with pytest.raises(StoreUnavailable, match="not reachable") as raised:
        PostgresMetadataStore(wrong, connect_timeout_s=1.0)
    assert masked_url(wrong) in str(raised.value)
    assert "not-the-password" not in str(raised.value)


async def test_central_on_postgres_keeps_pushes_across_a_restart_and_never_logs_the_password(
    postgres_url: str, tmp_path: Path, small_model_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = psycopg.conninfo.conninfo_to_dict(postgres_url)["password"]
    assert isinstance(password, str) and password
    settings = central_settings(tmp_path / "central", store={"url": postgres_url}, log_level="debug")
    caplog.set_level(logging.DEBUG)

    first = CentralServer(settings)
    await first.start()
    try:
        async with httpx.AsyncClient(base_url=first.http_url, timeout=30.0) as api:
            r = await push(api, "tiny", small_model_file)
            assert r.status_code == 201, r.text
            pushed = r.json()["manifest"]
    finally:
        await first.stop()
    assert not (tmp_path / "central" / "central.sqlite3").exists(), "metadata went to PostgreSQL, not SQLite"

    second = CentralServer(settings)
    await second.start()
    try:
        async with httpx.AsyncClient(base_url=second.http_url, timeout=30.0) as api:
            got = await api.get("/api/v1/models/tiny/versions/1")
            assert got.status_code == 200, got.text
            assert got.json() == pushed
            models = (await api.get("/api/v1/models")).json()
            assert [m["name"] for m in models] == ["tiny"]
    finally:
        await second.stop()

    assert masked_url(postgres_url) in caplog.text, "the store's URL is logged, masked"
    assert password not in caplog.text


def test_replicas_rewriting_one_version_at_once_keep_both_changes(postgres_url: str) -> None:
    """Two replicas each add an artifact to one version (a conversion for another runtime, a
    pending candidate promoted...): read in a transaction, the row is locked, so the second
    reads the first's change instead of overwriting it with the manifest both started from."""
    first, second = PostgresMetadataStore(postgres_url), PostgresMetadataStore(postgres_url)
    try:
        served = manifest("m", "1", ["a"])
        first.insert_version(served)
        first_read, second_started = threading.Event(), threading.Event()

        def add(store: PostgresMetadataStore, artifact: str) -> None:
            with store.transaction():
                record = store.get_version("m", "1")
                assert record is not None
                if store is first:
                    first_read.set()
                    second_started.wait(10)
                    time.sleep(0.3)  # the second replica's read is under way meanwhile
                extra = served.model_copy(update={"artifact": artifact})
                store.replace_manifests(record.manifest, {**record.artifacts, artifact: extra})

        def second_replica() -> None:
            first_read.wait(10)
            second_started.set()
            add(second, "fp32-b")

        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(add, first, "fp32-a"), pool.submit(second_replica)]
            for future in done:
                future.result()
        record = first.get_version("m", "1")
        assert record is not None and set(record.artifacts) == {served.artifact, "fp32-a", "fp32-b"}
    finally:
        first.close()
        second.close()
