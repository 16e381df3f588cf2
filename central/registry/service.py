"""The registry: pushes, reads and deletes of model versions.

Order of a push: stage the upload → run the pipeline (validate, chunk, manifest)
in a worker thread → commit the version in one transaction (with a plain push's
activation, when the storage has one transaction for both) → tell the distribution
side. Blobs are durable before the commit, so a crash at any point leaves either the
whole version or none of it."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from central.errors import Conflict, InvalidName, NotFound
from central.registry.pipeline import PushContext, PushPipeline
from central.registry.staging import StagedUpload
from central.storage.offload import INLINE, StoreCalls
from central.storage.protocols import ChunkBlobs, MetadataStore, ModelRecord, VersionExists, VersionRecord
from fleetwire import names
from fleetwire.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryUsage:
    """What the registry holds, for the metrics."""

    models: int
    versions: int
    blobs: int
    blob_bytes: int


@dataclass(frozen=True)
class PushResult:
    """A committed push: its manifest and what the pipeline reported."""

    manifest: Manifest
    report: dict[str, Any]


def check_name(kind: str, value: str) -> str:
    """Validate a model name or version label; 422 when it is not path-safe."""
    try:
        return names.check_name(kind, value)
    except names.InvalidName as exc:
        raise InvalidName(str(exc)) from exc


class RegistryService:
    """Model versions: stored, listed, deleted. Its async methods await the store through
    ``calls`` (worker threads), never on the event loop."""

    def __init__(
        self,
        store: MetadataStore,
        blobs: ChunkBlobs,
        pipeline: PushPipeline,
        on_change: Callable[[], None],
        transaction: Callable[[], AbstractContextManager[object]] = nullcontext,
        calls: StoreCalls = INLINE,
    ) -> None:
        """``transaction``: opens one transaction of the storage (``Storage.transaction``), so a
        version and what a push writes beside it (its activation) commit together. ``calls``:
        where store calls run (``Central``'s worker threads; inline for tools and tests)."""
        self.store = store
        self._calls = calls
        self._transaction = transaction
        self.blobs = blobs
        self.pipeline = pipeline
        self._on_change = on_change
        # Deletes garbage-collect blobs; a push that reuses a blob must not race that.
        self._mutation = asyncio.Lock()

    async def check_request(self, name: str, version: str | None) -> None:
        """Refuse a bad name, bad label or taken version before the body is read."""
        check_name("model name", name)
        if version:
            check_name("version", version)
            await self.ensure_new(name, version)

    def _next_free_version(self, name: str) -> str:
        seq = self.store.next_seq(name)
        while self.store.get_version(name, str(seq)) is not None:  # an explicit numeric label took it
            seq += 1
        return str(seq)

    async def ensure_new(self, name: str, version: str) -> None:
        """409 when the version exists already."""
        if await self._calls(self.store.get_version, name, version) is not None:
            raise Conflict(f"model {name!r} already has a version {version!r}")

    async def push(
        self,
        name: str,
        version: str | None,
        labels: dict[str, str],
        upload: StagedUpload,
        *,
        calibration: Path | None = None,
        keep_fp32: bool = False,
        eval_data: Path | None = None,
        threshold: float | None = None,
        dims: dict[str, int] | None = None,
        require_int8: bool = False,
        in_commit: Callable[[str], None] | None = None,
    ) -> PushResult:
        """Run the pipeline on a staged upload and commit the version.

        ``in_commit`` is called with the version's label in the version's transaction, in a
        worker thread (a plain push's activation: the model's release pointer); if it raises,
        the version is not stored either.

        ``version`` None means the next number, chosen under the lock so that
        concurrent pushes get distinct ones. The staged file is always discarded.
        """
        work_dir: Path | None = None
        try:
            await self.check_request(name, version)
            async with self._mutation:
                label: str = version if version else await self._calls(self._next_free_version, name)
                await self.ensure_new(name, label)
                # Beside the upload's directory, not in it: the upload holds the model's files only.
                work_dir = Path(tempfile.mkdtemp(dir=upload.directory.parent, prefix="push-"))
                ctx = PushContext(
                    name,
                    label,
                    labels,
                    upload.path,
                    upload.sha256,
                    upload.size,
                    staged_files=sorted(upload.files),
                    calibration=calibration,
                    keep_fp32=keep_fp32,
                    threshold=threshold,
                    dims=dict(dims or {}),
                    require_int8=require_int8,
                    eval_data=eval_data,
                    work_dir=work_dir,
                )
                manifest = await asyncio.to_thread(self.pipeline.run, ctx)
                try:
                    await asyncio.to_thread(self._commit, manifest, ctx.manifests, in_commit)
                except VersionExists as exc:
                    raise Conflict(f"model {name!r} already has a version {label!r}") from exc
        finally:
            upload.discard()
            if work_dir is not None:
                shutil.rmtree(work_dir, ignore_errors=True)
        served = manifest.served()
        log.info(
            "pushed %s:%s (%d files, %d bytes, %d chunks)",
            name, label, 1 + len(served.files), served.total_size, len(served.all_chunks()),
        )  # fmt: skip
        self._on_change()
        return PushResult(manifest=manifest, report=ctx.report)

    def _commit(
        self, manifest: Manifest, artifacts: dict[str, Manifest], in_commit: Callable[[str], None] | None
    ) -> None:
        with self._transaction():
            self.store.insert_version(manifest, artifacts)
            if in_commit is not None:
                in_commit(manifest.version)

    def remove_orphan_blobs(self) -> int:
        """Delete blobs no version references (left by a push killed mid-way); at start-up only.
        A blob younger than the store's grace period stays (a push on another central sharing
        the store may be about to reference it)."""
        referenced = self.store.referenced_digests()
        return sum(self.blobs.delete(d) for d in list(self.blobs.digests()) if d not in referenced)

    async def list_models(self) -> list[ModelRecord]:
        """Every model."""
        return await self._calls(self.store.list_models)

    async def list_versions(self, name: str) -> list[VersionRecord]:
        """Versions of one model; 404 if it has none."""
        check_name("model name", name)
        versions = await self._calls(self.store.list_versions, name)
        if not versions:
            raise NotFound(f"unknown model {name!r}")
        return versions

    async def get(self, name: str, version: str) -> VersionRecord:
        """One version; 404 if unknown."""
        check_name("model name", name)
        check_name("version", version)
        record = await self._calls(self.store.get_version, name, version)
        if record is None:
            raise NotFound(f"model {name!r} has no version {version!r}")
        return record

    async def latest(self) -> list[tuple[ModelRecord, VersionRecord | None]]:
        """Every model with its newest version (None if deleted since the list was read), read
        in one worker call."""
        return await self._calls(self._latest)

    def _latest(self) -> list[tuple[ModelRecord, VersionRecord | None]]:
        return [(m, self.store.get_version(m.name, m.latest) if m.latest else None) for m in self.store.list_models()]

    async def recent(self, limit: int) -> tuple[list[ModelRecord], dict[str, list[VersionRecord]]]:
        """Every model, and the newest ``limit`` versions of each (newest first), read in one
        worker call (the dashboard's)."""
        return await self._calls(self._recent, limit)

    def _recent(self, limit: int) -> tuple[list[ModelRecord], dict[str, list[VersionRecord]]]:
        models = self.store.list_models()
        versions = {
            m.name: sorted(self.store.list_versions(m.name), key=lambda r: r.seq, reverse=True)[:limit]
            for m in models
            if m.versions
        }
        return models, versions

    async def usage(self) -> RegistryUsage:
        """How many models and versions are stored, and the blobs' count and bytes (one worker call)."""
        return await self._calls(self._usage)

    def _usage(self) -> RegistryUsage:
        models = self.store.list_models()
        blobs, size = self.blobs.usage()
        return RegistryUsage(len(models), sum(m.versions for m in models), blobs, size)

    async def describe(self, name: str, version: str | None) -> tuple[Manifest, list[str]] | None:
        """The served manifest of ``version`` (None: the model's newest) and the names of every
        stored version, oldest first; None when the model or that version is unknown."""
        records = await self._calls(self.store.list_versions, name)
        found = records[-1] if records and version is None else next((r for r in records if r.version == version), None)
        return None if found is None else (found.manifest, [r.version for r in records])

    async def delete(self, name: str, version: str) -> None:
        """Delete a version and its unshared blobs (every file of every artifact: ``unique_chunks``
        covers data files and alternatives). Whether the fleet serves it is the rollouts' to say
        (``RolloutService.check_deletable``), checked by the caller first."""
        record = await self.get(name, version)
        async with self._mutation:
            await self._calls(self.store.delete_version, name, version)
            referenced = await self._calls(self.store.referenced_digests)
            for artifact in {**record.artifacts, "_served": record.manifest}.values():
                for chunk in artifact.unique_chunks():
                    if chunk.digest not in referenced:
                        await asyncio.to_thread(self.blobs.delete, chunk.digest)
        self._on_change()
