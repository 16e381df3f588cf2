"""Artifacts converted for older runtimes (``central.registry.conversion``), on a real SQLite
registry and blob store: a failure the same input always meets is kept, a passing one (a
missing blob, storage) is forgotten and tried again; an artifact converted for a runtime that
still loads none is a refusal, not a wait; one version is converted for a bounded number of
runtimes; runtimes differing only in their ``ai.onnx.ml`` opset get artifacts of their own."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import onnx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.chunker import Chunker
from central.registry.conversion import MAX_TARGETS_PER_VERSION, RuntimeConversions, target_name
from central.registry.signing import ManifestSigner
from central.settings import ChunkingSettings
from central.storage.blobs.local import BlobStore
from central.storage.protocols import utc_now
from central.storage.sqlite.database import database
from central.storage.sqlite.registry import SQLiteMetadataStore
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.runtime_limits import FORMATS_KEY, ML_DOMAIN, ModelFormat, RuntimeLimits
from support.fleet import SMALL_CHUNKS
from support.onnx_versions import dense_model, gelu_model
from support.wait import wait_for

RETRY_S = 0.3


def old_runtime(opset: int, ml: int | None = 3) -> RuntimeLimits:
    opsets = {"": opset} if ml is None else {"": opset, ML_DOMAIN: ml}
    return RuntimeLimits(runtime="onnxruntime old", max_ir_version=9, max_opsets=opsets)


class Registry:
    """A registry holding one version ``m:1`` of ``model``, and its conversions."""

    def __init__(self, tmp_path: Path, model: onnx.ModelProto) -> None:
        db = database(tmp_path / "registry.sqlite3")
        self.store = SQLiteMetadataStore(db)
        self.blobs = BlobStore(tmp_path / "blobs")
        self.changes = 0
        body = model.SerializeToString()
        digest, _ = self.blobs.put(body)
        self.source = digest
        formats = {FORMATS_KEY: {"fp32": ModelFormat.of(model).as_json()}}
        manifest = Manifest(
            name="m", version="1", sha256=hashlib.sha256(body).hexdigest(), size=len(body),
            chunks=[ChunkRef(digest=digest, size=len(body))], created_at=utc_now(), quantization=formats,
        )  # fmt: skip
        self.store.insert_version(manifest)
        self.conversions = RuntimeConversions(
            self.store,
            self.blobs,
            Chunker(ChunkingSettings(**SMALL_CHUNKS)),
            ManifestSigner(Ed25519PrivateKey.generate()),
            on_change=self._changed,
            transaction=db.transaction,  # as central's storage: conversions in threads add to one version
            retry_after_s=RETRY_S,
        )

    def _changed(self) -> None:
        self.changes += 1

    def manifest(self) -> Manifest:
        record = self.store.get_version("m", "1")
        assert record is not None
        return record.manifest

    def artifacts(self) -> list[str]:
        return [a.artifact for a in self.manifest().artifacts()]


@pytest.fixture
async def dense(tmp_path: Path) -> AsyncIterator[Registry]:
    registry = Registry(tmp_path, dense_model(21))
    yield registry
    await registry.conversions.stop()
    registry.store.close()


def test_the_target_name_carries_the_ml_opset() -> None:
    assert target_name(old_runtime(18, ml=3)) == "fp32-ir9-opset18-ml3"
    assert target_name(old_runtime(18, ml=4)) != target_name(old_runtime(18, ml=3))
    assert target_name(old_runtime(18, ml=None)) == "fp32-ir9-opset18"


async def test_a_failure_of_the_model_itself_is_kept(tmp_path: Path) -> None:
    registry = Registry(tmp_path, gelu_model(21))  # Gelu has no version before opset 20
    try:
        manifest, runtime = registry.manifest(), old_runtime(18)
        assert registry.conversions.request(manifest, runtime) is None  # under way
        await registry.conversions.stop()
        why = registry.conversions.request(manifest, runtime)
        assert why is not None and "cannot convert it down" in why and "Gelu" in why
        await asyncio.sleep(RETRY_S * 1.5)
        assert registry.conversions.request(manifest, runtime) == why and registry.changes == 0
    finally:
        registry.store.close()


async def test_a_passing_failure_is_forgotten_and_tried_again(dense: Registry) -> None:
    """The source's blob unreadable (a blob store timing out, a replica still copying it): the
    node waits instead of failing for good, and once the blob reads the conversion is stored."""
    body = dense.blobs.path(dense.source).read_bytes()
    dense.blobs.path(dense.source).unlink()
    manifest, runtime = dense.manifest(), old_runtime(18)
    assert dense.conversions.request(manifest, runtime) is None
    await dense.conversions.stop()
    assert dense.conversions.request(manifest, runtime) is None  # not failed: tried again later
    assert dense.artifacts() == ["fp32"]
    dense.blobs.put(body)
    await wait_for(lambda: dense.changes == 1, 5, "the re-placement once the retry delay is over")
    assert dense.conversions.request(manifest, runtime) is None  # tried again now
    await dense.conversions.stop()
    assert dense.artifacts() == ["fp32", target_name(runtime)] and dense.changes == 2


async def test_a_converted_artifact_that_does_not_load_either_is_a_refusal(dense: Registry) -> None:
    runtime = old_runtime(18)
    assert dense.conversions.request(dense.manifest(), runtime) is None
    await dense.conversions.stop()
    stored = dense.manifest()
    assert stored.artifact_named(target_name(runtime)) is not None
    # The node still loads none (the same answer from another replica, or after a restart).
    fresh = RuntimeConversions(
        dense.store, dense.blobs, Chunker(ChunkingSettings(**SMALL_CHUNKS)),
        ManifestSigner(Ed25519PrivateKey.generate()), on_change=lambda: None,
    )  # fmt: skip
    for conversions in (dense.conversions, fresh):
        why = conversions.request(stored, runtime)
        assert why is not None and "does not load either" in why


async def test_one_version_is_converted_for_a_bounded_number_of_runtimes(dense: Registry) -> None:
    runtimes = [old_runtime(18, ml=ml) for ml in range(1, MAX_TARGETS_PER_VERSION + 1)]
    manifest = dense.manifest()
    assert [dense.conversions.request(manifest, r) for r in runtimes] == [None] * MAX_TARGETS_PER_VERSION
    one_more = old_runtime(17)
    why = dense.conversions.request(manifest, one_more)
    assert why is not None and f"at most {MAX_TARGETS_PER_VERSION} runtimes" in why
    await dense.conversions.stop()
    stored = dense.manifest()
    assert len(stored.artifacts()) == 1 + MAX_TARGETS_PER_VERSION
    why = dense.conversions.request(stored, one_more)
    assert why is not None and f"at most {MAX_TARGETS_PER_VERSION} runtimes" in why
