"""The push pipeline: a staged upload goes through a list of steps, each of which
reads and extends one ``PushContext``. Quantization and the accuracy guard are
steps to insert here; nothing else has to change."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import onnx

from central.registry.blobs import BlobStore
from central.registry.chunker import Chunker
from central.registry.sqlite_impl import utc_now
from central.registry.validate import load_checked, signature
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec


@dataclass
class PushContext:
    """What one push knows so far; steps fill it in order."""

    name: str
    version: str
    labels: dict[str, str]
    upload: Path
    upload_sha256: str
    upload_size: int
    model: onnx.ModelProto | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    chunks: list[ChunkRef] = field(default_factory=list)
    manifest: Manifest | None = None
    report: dict[str, Any] = field(default_factory=dict)


class PushStep(Protocol):
    """One stage of a push. Runs in a worker thread; raises ``CentralError`` to refuse."""

    name: str

    def run(self, ctx: PushContext) -> None:
        """Read and extend ``ctx``."""


class ValidateStep:
    """``onnx.checker`` plus the model's signature."""

    name = "validate"

    def run(self, ctx: PushContext) -> None:
        """Reject what is not a valid self-contained ONNX model."""
        ctx.model = load_checked(ctx.upload)
        ctx.inputs, ctx.outputs = signature(ctx.model)
        ctx.model = None  # the proto can be large; later steps re-read the file


class ChunkStep:
    """Content-defined chunks, each stored durably before the version is committed."""

    name = "chunk"

    def __init__(self, chunker: Chunker, blobs: BlobStore) -> None:
        self._chunker = chunker
        self._blobs = blobs

    def run(self, ctx: PushContext) -> None:
        """Cut the upload and store every chunk by digest."""
        new_bytes = 0
        for data in self._chunker.cut(ctx.upload):
            digest, created = self._blobs.put(data)
            new_bytes += len(data) if created else 0
            ctx.chunks.append(ChunkRef(digest=digest, size=len(data)))
        ctx.report["chunks"] = len(ctx.chunks)
        ctx.report["new_chunk_bytes"] = new_bytes
        ctx.report["unique_chunks"] = len({c.digest for c in ctx.chunks})


class ManifestStep:
    """The manifest of the version, from everything the steps before found."""

    name = "manifest"

    def run(self, ctx: PushContext) -> None:
        """Assemble the manifest; the registry commits it."""
        ctx.manifest = Manifest(
            name=ctx.name,
            version=ctx.version,
            sha256=ctx.upload_sha256,
            size=ctx.upload_size,
            chunks=ctx.chunks,
            inputs=ctx.inputs,
            outputs=ctx.outputs,
            created_at=utc_now(),
            labels=ctx.labels,
        )


class PushPipeline:
    """Runs steps in order and records how long each took."""

    def __init__(self, steps: list[PushStep]) -> None:
        self.steps = steps

    def run(self, ctx: PushContext) -> Manifest:
        """Run every step; the first error stops the push with nothing committed."""
        timings: dict[str, float] = {}
        for step in self.steps:
            started = time.perf_counter()
            step.run(ctx)
            timings[step.name] = round(time.perf_counter() - started, 4)
        ctx.report["step_seconds"] = timings
        assert ctx.manifest is not None, "the pipeline has no manifest step"
        return ctx.manifest
