"""The push pipeline: a staged upload goes through a list of steps, each of which
reads and extends one ``PushContext``. Quantization and the accuracy guard are
steps to insert here; nothing else has to change."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from central.registry.blobs import BlobStore
from central.registry.chunker import Chunker
from central.registry.signing import ManifestSigner
from central.registry.sqlite_impl import utc_now
from central.registry.validate import load_checked, signature
from fleetwire.digest import sha256_file
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec

#: Told ``(step, "start" | "end")`` as a push moves on, from the pipeline's worker thread.
#: Set by a transport that streams progress to the operator (``?progress=ndjson``); the
#: worker thread inherits it from the request's context, so no signature has to change.
push_progress: ContextVar[Callable[[str, str], None] | None] = ContextVar("push_progress", default=None)


def report_progress(step: str, phase: str) -> None:
    """Tell a listening client that ``step`` starts or ends; nothing when nobody listens."""
    listener = push_progress.get()
    if listener is not None:
        listener(step, phase)


@dataclass
class PushContext:
    """What one push knows so far; steps fill it in order."""

    name: str
    version: str
    labels: dict[str, str]
    upload: Path
    upload_sha256: str
    upload_size: int
    #: Calibration data (.npz, arrays named after the model's inputs), if the operator sent any.
    calibration: Path | None = None
    #: The operator asked to serve FP32 when INT8 fails the accuracy guard.
    keep_fp32: bool = False
    #: Push options of the quantize and guard steps: the guard's threshold (None: central's
    #: setting), sizes of named dynamic dimensions for generated samples (``--dim seq=128``),
    #: and evaluation data (.npz of the inputs plus a ``label`` array), if the operator sent any.
    threshold: float | None = None
    dims: dict[str, int] = field(default_factory=dict)
    eval_data: Path | None = None
    #: A scratch directory for this push (quantized files, ...); removed after the push.
    work_dir: Path | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    #: Files to store, by artifact name; "fp32" is the upload, quantization adds its
    #: candidates by recipe name ("int8-u8s8-qdq", ...).
    artifacts: dict[str, Path] = field(default_factory=dict)
    #: The artifact edges get by default.
    served_artifact: str = "fp32"
    #: Other artifacts (by name, in ``artifacts``) the served manifest carries as
    #: alternatives an edge may choose: those that passed the guard, and fp32 always.
    alternatives: list[str] = field(default_factory=list)
    #: Per-artifact reports (recipe, guard verdict), carried in each ``ArtifactRef.quantization``.
    artifact_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The quantization step's report (method, per-channel, sizes, agreement, seconds).
    quantization: dict[str, Any] | None = None
    #: What the quantize step hands the guard step (a ``central.quantize.plan.QuantizePlan``).
    quantize_plan: object | None = None
    artifact_chunks: dict[str, list[ChunkRef]] = field(default_factory=dict)
    #: Every artifact's manifest; ``manifest`` is the served one.
    manifests: dict[str, Manifest] = field(default_factory=dict)
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
        # The proto can be large: it is not kept in the context; later steps re-read the file.
        ctx.inputs, ctx.outputs = signature(load_checked(ctx.upload))


class ChunkStep:
    """Content-defined chunks of every artifact, each stored durably before the commit."""

    name = "chunk"

    def __init__(self, chunker: Chunker, blobs: BlobStore) -> None:
        self._chunker = chunker
        self._blobs = blobs

    def run(self, ctx: PushContext) -> None:
        """Cut each artifact and store every chunk by digest."""
        ctx.artifacts.setdefault("fp32", ctx.upload)
        new_bytes = 0
        for artifact, path in ctx.artifacts.items():
            chunks, new = self._cut(path)
            ctx.artifact_chunks[artifact] = chunks
            new_bytes += new
        served = ctx.artifact_chunks[ctx.served_artifact]
        ctx.report["chunks"] = len(served)
        ctx.report["unique_chunks"] = len({c.digest for c in served})
        ctx.report["new_chunk_bytes"] = new_bytes

    def _cut(self, path: Path) -> tuple[list[ChunkRef], int]:
        chunks, new_bytes = [], 0
        for data in self._chunker.cut(path):
            digest, created = self._blobs.put(data)
            new_bytes += len(data) if created else 0
            chunks.append(ChunkRef(digest=digest, size=len(data)))
        return chunks, new_bytes


class ManifestStep:
    """One manifest per artifact, from everything the steps before found."""

    name = "manifest"

    def __init__(self, signer: ManifestSigner | None = None) -> None:
        #: Signs every manifest (edges refuse unsigned ones); None only in unit tests of the steps.
        self._signer = signer

    def run(self, ctx: PushContext) -> None:
        """Assemble the manifests (signed); the registry commits them."""
        created = utc_now()
        for artifact, path in ctx.artifacts.items():
            is_upload = path == ctx.upload
            ctx.manifests[artifact] = Manifest(
                name=ctx.name,
                version=ctx.version,
                sha256=ctx.upload_sha256 if is_upload else sha256_file(path),
                size=ctx.upload_size if is_upload else path.stat().st_size,
                chunks=ctx.artifact_chunks[artifact],
                inputs=ctx.inputs,
                outputs=ctx.outputs,
                created_at=created,
                labels=ctx.labels,
                artifact=artifact,
                quantization=ctx.quantization,
            )
        if self._signer is not None:
            ctx.manifests = self._signer.sign_all(ctx.manifests)
        ctx.manifest = ctx.manifests[ctx.served_artifact]


class PushPipeline:
    """Runs steps in order and records how long each took."""

    def __init__(self, steps: list[PushStep]) -> None:
        self.steps = steps

    def run(self, ctx: PushContext) -> Manifest:
        """Run every step; the first error stops the push with nothing committed."""
        timings: dict[str, float] = {}
        for step in self.steps:
            started = time.perf_counter()
            report_progress(step.name, "start")
            step.run(ctx)
            report_progress(step.name, "end")
            timings[step.name] = round(time.perf_counter() - started, 4)
        ctx.report["step_seconds"] = timings
        assert ctx.manifest is not None, "the pipeline has no manifest step"
        return ctx.manifest
