"""The push pipeline: a staged upload goes through a list of steps, each of which
reads and extends one ``PushContext``. Quantization and the accuracy guard are
steps to insert here; nothing else has to change."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import onnx

from central.registry.chunker import Chunker
from central.registry.companions import check_sizes, is_companion, split_companions
from central.registry.decoder import DecoderSpec, inspect_decoder
from central.registry.runtime_compat import make_loadable
from central.registry.signing import ManifestSigner
from central.registry.validate import data_files, load_checked, signature
from central.storage.protocols import ChunkBlobs, utc_now
from fleetwire.manifest import KIND_DECODER, KIND_TENSOR, ArtifactRef, ChunkRef, FileRef, Manifest, TensorSpec
from fleetwire.runtime_limits import FORMATS_KEY, ModelFormat, runtime_limits

log = logging.getLogger(__name__)

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
    #: The external-data files staged next to ``upload``, by name (what the graph must
    #: reference, exactly); None when not known (then only existence is checked).
    staged_files: list[str] | None = None
    #: Calibration data (.npz, arrays named after the model's inputs), if the operator sent any.
    calibration: Path | None = None
    #: The operator asked to serve FP32 when INT8 fails the accuracy guard (``--fp32``).
    keep_fp32: bool = False
    #: The operator asked for the push to be refused (422) when INT8 cannot be made or
    #: proven (``--require-int8``); by default such a version is stored and served as FP32.
    require_int8: bool = False
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
    #: ``tensor``, or ``decoder`` for a language model (``central.registry.decoder``).
    kind: str = KIND_TENSOR
    #: A language model's checked figures and names (None for a tensor model).
    decoder: DecoderSpec | None = None
    #: Files beside the graph that every artifact carries as they came (a language model's
    #: tokenizer, config, chat template: ``central.registry.companions``), by name.
    companion_files: list[str] = field(default_factory=list)
    #: Files to store, by artifact name; "fp32" is the upload, quantization adds its
    #: candidates by recipe name ("int8-u8s8-qdq", ...).
    artifacts: dict[str, Path] = field(default_factory=dict)
    #: The artifact edges get by default.
    served_artifact: str = "fp32"
    #: Other artifacts (by name, in ``artifacts``) the served manifest carries as
    #: alternatives an edge may choose: those that passed the guard, and fp32 always.
    alternatives: list[str] = field(default_factory=list)
    #: INT8 candidates (by name, in ``artifacts``) too few samples proved, best first: the served
    #: manifest carries them as ``pending``, run beside FP32 on live traffic until central
    #: promotes or rejects them (``central.rollout.promotion``).
    pending: list[str] = field(default_factory=list)
    #: Per-artifact reports (recipe, guard verdict), carried in each ``ArtifactRef.quantization``.
    artifact_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The quantization step's report (method, per-channel, sizes, agreement, seconds).
    quantization: dict[str, Any] | None = None
    #: What the quantize step hands the guard step (a ``central.quantize.plan.QuantizePlan``).
    quantize_plan: object | None = None
    #: Chunks of each artifact's graph file (``artifact_refs`` has every file's).
    artifact_chunks: dict[str, list[ChunkRef]] = field(default_factory=dict)
    #: Each artifact's files and chunks, as the chunk step stored them (no quantization yet).
    artifact_refs: dict[str, ArtifactRef] = field(default_factory=dict)
    #: Every artifact's manifest; ``manifest`` is the served one.
    manifests: dict[str, Manifest] = field(default_factory=dict)
    #: Each artifact's IR version and opsets, as the chunk step read them from its graph: the
    #: served manifest's push report carries them (``formats``), so central can tell which nodes'
    #: runtimes load which artifact (``central.distribution.runtime_fit``).
    formats: dict[str, ModelFormat] = field(default_factory=dict)
    manifest: Manifest | None = None
    report: dict[str, Any] = field(default_factory=dict)


class PushStep(Protocol):
    """One stage of a push. Runs in a worker thread; raises ``CentralError`` to refuse."""

    name: str

    def run(self, ctx: PushContext) -> None:
        """Read and extend ``ctx``."""


class KindSteps:
    """One pipeline stage done differently per kind of model: a language model (``decoder``)
    gets weight-only quantization judged on text, never the INT8 recipes of tensor models.
    A kind with no step of its own skips the stage."""

    def __init__(self, name: str, by_kind: dict[str, PushStep]) -> None:
        self.name = name
        self._by_kind = by_kind

    def run(self, ctx: PushContext) -> None:
        """Run the step of ``ctx.kind`` (known once ``validate`` ran)."""
        step = self._by_kind.get(ctx.kind)
        if step is not None:
            step.run(ctx)


class ValidateStep:
    """``onnx.checker``, a model ONNX Runtime can load (``runtime_compat``), the model's
    signature, and for a language model the agreement of its config, graph and tokenizer."""

    name = "validate"

    def run(self, ctx: PushContext) -> None:
        """Reject what is not a valid ONNX model with exactly its data files (and, for a
        language model, its allow-listed companions), or what ONNX Runtime cannot load and
        cannot be converted for it, or a language model whose files disagree."""
        # The proto can be large: it is not kept in the context; later steps re-read the file.
        model = load_checked(ctx.upload, ctx.staged_files, is_companion)
        compat = make_loadable(ctx.upload, model, runtime_limits())
        if compat.changes:
            ctx.report["compatibility"] = compat.report()
        ctx.inputs, ctx.outputs = signature(model)
        _, ctx.companion_files = split_companions(ctx.staged_files or [], data_files(model))
        check_sizes(ctx.upload.parent, ctx.companion_files)
        info = inspect_decoder(ctx.upload.parent, model, ctx.companion_files)
        if info is not None:
            ctx.kind, ctx.decoder = KIND_DECODER, info.spec
            ctx.report["language_model"] = info.report


class ChunkStep:
    """Content-defined chunks of every file of every artifact, each chunk stored durably
    before the commit. Files are read once, in blocks (sha256 on the way), never whole."""

    name = "chunk"

    def __init__(self, chunker: Chunker, blobs: ChunkBlobs) -> None:
        self._chunker = chunker
        self._blobs = blobs

    def run(self, ctx: PushContext) -> None:
        """Cut each artifact's graph and data files and store every chunk by digest."""
        ctx.artifacts.setdefault("fp32", ctx.upload)
        new_bytes = 0
        companions = [ctx.upload.parent / name for name in ctx.companion_files]
        for artifact, graph in ctx.artifacts.items():
            ref, new, ctx.formats[artifact] = self._artifact(artifact, graph, companions)
            ctx.artifact_refs[artifact] = ref
            ctx.artifact_chunks[artifact] = ref.chunks
            new_bytes += new
        served = ctx.artifact_refs[ctx.served_artifact]
        chunks = served.chunks + [c for f in served.files for c in f.chunks]
        ctx.report["chunks"] = len(chunks)
        ctx.report["unique_chunks"] = len({c.digest for c in chunks})
        ctx.report["files"] = 1 + len(served.files)
        ctx.report["total_bytes"] = served.total_size
        ctx.report["new_chunk_bytes"] = new_bytes

    def _artifact(self, artifact: str, graph: Path, companions: list[Path]) -> tuple[ArtifactRef, int, ModelFormat]:
        """The artifact's graph, its data files (those its graph names, next to it) and the
        push's companion files (the same in every artifact: their chunks dedupe), cut; with
        the bytes newly stored and the graph's format."""
        sha256, size, chunks, new_bytes = self._cut(graph)
        files = []
        model = onnx.load(str(graph), load_external_data=False)
        data = [graph.parent / name for name in data_files(model)]
        for path in [*data, *companions]:
            file_sha256, file_size, file_chunks, new = self._cut(path)
            files.append(FileRef(path=path.name, sha256=file_sha256, size=file_size, chunks=file_chunks))
            new_bytes += new
        ref = ArtifactRef(artifact=artifact, sha256=sha256, size=size, chunks=chunks, files=files)
        return ref, new_bytes, ModelFormat.of(model)

    def _cut(self, path: Path) -> tuple[str, int, list[ChunkRef], int]:
        """(sha256, size, chunks, bytes newly stored) of one file, streamed."""
        whole = hashlib.sha256()
        chunks, size, new_bytes = [], 0, 0
        for data in self._chunker.cut(path):
            whole.update(data)
            size += len(data)
            digest, created = self._blobs.put(data)
            new_bytes += len(data) if created else 0
            chunks.append(ChunkRef(digest=digest, size=len(data)))
        return whole.hexdigest(), size, chunks, new_bytes


class ManifestStep:
    """One manifest per artifact, from everything the steps before found; the served one
    also carries the other artifacts an edge may choose (``alternatives``)."""

    name = "manifest"

    def __init__(self, signer: ManifestSigner | None = None) -> None:
        #: Signs every manifest (edges refuse unsigned ones); None only in unit tests of the steps.
        self._signer = signer

    def run(self, ctx: PushContext) -> None:
        """Assemble the manifests (signed); the registry commits them."""
        created = utc_now()
        refs = {
            artifact: ref.model_copy(update={"quantization": ctx.artifact_reports.get(artifact)})
            for artifact, ref in ctx.artifact_refs.items()
        }
        for artifact, ref in refs.items():
            served = artifact == ctx.served_artifact
            ctx.manifests[artifact] = Manifest(
                name=ctx.name,
                version=ctx.version,
                sha256=ref.sha256,
                size=ref.size,
                chunks=ref.chunks,
                files=ref.files,
                inputs=ctx.inputs,
                outputs=ctx.outputs,
                created_at=created,
                labels=ctx.labels,
                artifact=artifact,
                # Only the served manifest (the one edges and the planner read) names the formats:
                # an alternative's ref carries its own report (None for FP32: not quantized).
                quantization=with_formats(ctx.quantization, ctx.formats) if served else ctx.quantization,
                alternatives=[refs[a] for a in alternatives(ctx)] if served else [],
                pending=[refs[a] for a in ctx.pending if a in refs] if served else [],
                kind=ctx.kind,
            )
        if self._signer is not None:
            ctx.manifests = self._signer.sign_all(ctx.manifests)
        ctx.manifest = ctx.manifests[ctx.served_artifact]


def with_formats(report: dict[str, Any] | None, formats: dict[str, ModelFormat]) -> dict[str, Any] | None:
    """The push report with every artifact's format under ``formats`` (a push without
    quantization gets a report of its formats alone)."""
    if not formats:
        return report
    return {**(report or {}), FORMATS_KEY: {name: f.as_json() for name, f in formats.items()}}


def alternatives(ctx: PushContext) -> list[str]:
    """The artifacts the served manifest offers besides the served one: the quantize step's
    choice, in its order, and FP32 always (the one every CPU can run)."""
    names = [a for a in ctx.alternatives if a != ctx.served_artifact]
    unknown = [a for a in names if a not in ctx.artifact_refs]
    if unknown:
        log.warning("alternatives %s of %s:%s were never stored; left out", unknown, ctx.name, ctx.version)
    names = [a for a in dict.fromkeys(names) if a in ctx.artifact_refs]
    if ctx.served_artifact != "fp32" and "fp32" not in names and "fp32" in ctx.artifact_refs:
        names.append("fp32")
    return names


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
