"""Artifacts converted for nodes whose ONNX Runtime is older than a version's model.

A push is fitted to central's own runtime; a node that registered with an older one
(``central.distribution.runtime_fit``) may be unable to load any artifact of a version. Central
then tries to make one it can: the version's FP32 graph converted down to the node's newest
``ai.onnx`` opset with ONNX's version converter and its IR version stamped down where the
content allows (the same rules as at push time, ``runtime_compat.fit_model``). The converted
graph is chunked and stored like any artifact, named ``fp32-ir<N>-opset<M>``, and added to the
version's alternatives in a re-signed manifest; its external-data files are the FP32 ones
(the converter keeps tensors where they are), so only the graph's chunks are new. The node's
desired state then forces it (``force_artifact``); other nodes may time it like any artifact.

One conversion per (version, target) per process, in a worker thread; a failure is kept with
its reason (ONNX's converter has no older version of an operator, an ``ai.onnx.ml`` opset,
an IR feature) and becomes the node's per-node failure, reason ``runtime``. Nothing is stored
unless the converted graph passes ``onnx.checker``; the manifest is re-read inside the store
transaction, so two replicas converting the same version add it once."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import onnx

from central.errors import CentralError
from central.registry.chunker import Chunker
from central.registry.runtime_compat import fit_model
from central.registry.signing import ManifestSigner
from central.storage.protocols import ChunkBlobs, MetadataStore
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.runtime_limits import DEFAULT_DOMAIN, FORMATS_KEY, ModelFormat, RuntimeLimits

__all__ = ["Converted", "RuntimeConversions", "target_name"]

log = logging.getLogger(__name__)

#: The artifact every version has, and the one converted.
SOURCE_ARTIFACT = "fp32"


def target_name(runtime: RuntimeLimits) -> str:
    """The converted artifact's name for ``runtime``: ``fp32-ir9-opset18``."""
    return f"{SOURCE_ARTIFACT}-ir{runtime.max_ir_version}-opset{runtime.max_opset(DEFAULT_DOMAIN)}"


@dataclass(frozen=True)
class Converted:
    """A converted graph, stored as chunks: the artifact to add, and its format."""

    ref: ArtifactRef
    format: ModelFormat


class RuntimeConversions:
    """Converts versions for older runtimes on demand; remembers what it tried."""

    def __init__(
        self,
        store: MetadataStore,
        blobs: ChunkBlobs,
        chunker: Chunker,
        signer: ManifestSigner,
        on_change: Callable[[], None],
        transaction: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        """``on_change``: called on the event loop once a converted artifact is stored."""
        self._store = store
        self._blobs = blobs
        self._chunker = chunker
        self._signer = signer
        self._on_change = on_change
        self._transaction = transaction
        #: (name, version, artifact) → None while converting, else why it cannot be.
        self._tried: dict[tuple[str, str, str], str | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, manifest: Manifest, runtime: RuntimeLimits) -> str | None:
        """Why ``manifest`` cannot be converted for ``runtime`` (None: under way, or done and
        soon in the manifest). The first request starts the conversion in the background."""
        if runtime.max_opset(DEFAULT_DOMAIN) is None:
            return "the node did not say which ai.onnx opsets it loads"
        key = (manifest.name, manifest.version, target_name(runtime))
        if key in self._tried:
            return self._tried[key]
        if manifest.artifact_named(SOURCE_ARTIFACT) is None:
            self._tried[key] = f"it has no {SOURCE_ARTIFACT} artifact to convert"
            return self._tried[key]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asked off the event loop: the next ask on it starts the conversion
            return None
        self._tried[key] = None
        task = loop.create_task(self._convert(key, runtime), name=f"convert {key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    async def stop(self) -> None:
        """Wait for conversions under way (their threads cannot be cancelled)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _convert(self, key: tuple[str, str, str], runtime: RuntimeLimits) -> None:
        name, version, artifact = key
        try:
            added = await asyncio.to_thread(self._convert_and_store, name, version, artifact, runtime)
        except Exception as exc:  # a converter bug must not end the loop: it becomes the node's failure
            reason = str(exc) if isinstance(exc, CentralError) else f"{type(exc).__name__}: {exc}"
            self._tried[key] = reason
            log.warning("%s:%s cannot be converted for %s: %s", name, version, runtime.runtime, reason)
            return
        if added:
            log.warning("%s:%s converted to %s for nodes on %s", name, version, artifact, runtime.runtime)
            self._on_change()

    def _convert_and_store(self, name: str, version: str, artifact: str, runtime: RuntimeLimits) -> bool:
        record = self._store.get_version(name, version)
        if record is None:
            raise CentralError(f"{name}:{version} is no longer stored")
        source = record.manifest.artifact_named(SOURCE_ARTIFACT)
        assert source is not None, "checked before the conversion started"
        converted = self._convert_graph(source, artifact, runtime)
        return self._add(name, version, converted)

    def _convert_graph(self, source: ArtifactRef, artifact: str, runtime: RuntimeLimits) -> Converted:
        """The source graph fitted to ``runtime``, checked and stored as chunks."""
        model = onnx.load_model_from_string(b"".join(self._blobs.read(c.digest) for c in source.chunks))
        fitted, _ = fit_model(model, runtime)  # BadRequest with the reason when it cannot be
        onnx.checker.check_model(fitted)  # in memory: external data is the source's, unchanged
        with tempfile.TemporaryDirectory(prefix="modelfleet-convert-") as scratch:
            graph = Path(scratch) / "model.onnx"
            graph.write_bytes(fitted.SerializeToString())
            whole, size, chunks = hashlib.sha256(), 0, []
            for data in self._chunker.cut(graph):
                whole.update(data)
                size += len(data)
                digest, _ = self._blobs.put(data)
                chunks.append(ChunkRef(digest=digest, size=len(data)))
        ref = ArtifactRef(artifact=artifact, sha256=whole.hexdigest(), size=size, chunks=chunks, files=source.files)
        return Converted(ref, ModelFormat.of(fitted))

    def _add(self, name: str, version: str, converted: Converted) -> bool:
        """Add the artifact to the version's manifests, re-signed; False when it is there already."""
        with self._transaction():
            record = self._store.get_version(name, version)
            if record is None:
                raise CentralError(f"{name}:{version} is no longer stored")
            served = record.manifest
            artifact = converted.ref.artifact
            if served.artifact_named(artifact) is not None:
                return False
            report = dict(served.quantization or {})
            report[FORMATS_KEY] = {**dict(report.get(FORMATS_KEY) or {}), artifact: converted.format.as_json()}
            reissued = served.model_copy(
                update={"alternatives": [*served.alternatives, converted.ref], "quantization": report, "signature": ""}
            )
            own = reissued.model_copy(
                update={
                    "sha256": converted.ref.sha256,
                    "size": converted.ref.size,
                    "chunks": converted.ref.chunks,
                    "files": converted.ref.files,
                    "artifact": artifact,
                    "quantization": {k: v for k, v in report.items() if k != FORMATS_KEY} or None,
                    "alternatives": [],
                    "pending": [],
                }
            )
            artifacts = {**record.artifacts, artifact: self._signer.sign(own)}
            self._store.replace_manifests(self._signer.sign(reissued), artifacts)
        return True
