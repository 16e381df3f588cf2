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

One conversion per (version, target) per process, in a worker thread. A failure the same
input always meets (``fit_model``'s ``BadRequest``: ONNX's converter has no older version of
an operator, an ``ai.onnx.ml`` opset, an IR feature; ``onnx.checker`` refusing the result) is
kept with its reason and becomes the node's per-node failure, reason ``runtime``. Any other
(a blob read timing out, the store unreachable, the version deleted meanwhile) is logged and
forgotten: the node waits, and the conversion is tried again ``retry_after_s`` later. Once a
version holds the converted artifact, a node that still loads none of its artifacts is
refused ("does not load either") rather than left waiting. Nothing is stored unless the
converted graph passes ``onnx.checker``; the manifest is re-read, its row locked, inside the
store transaction, so two replicas converting one version (for one target or two), or a
conversion racing a pending candidate's promotion, keep every change.

What a node reports of its runtime is its own word: central converts one version for at
most ``MAX_TARGETS_PER_VERSION`` runtimes and remembers at most ``MAX_TRIED`` outcomes, so
nodes reporting ever new limits cannot fill the store or the memory."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import onnx

from central.errors import BadRequest, CentralError
from central.registry.chunker import Chunker
from central.registry.runtime_compat import fit_model
from central.registry.signing import ManifestSigner
from central.storage.protocols import ChunkBlobs, MetadataStore
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.runtime_limits import DEFAULT_DOMAIN, FORMATS_KEY, ML_DOMAIN, ModelFormat, RuntimeLimits

__all__ = ["Converted", "RuntimeConversions", "target_name"]

log = logging.getLogger(__name__)

#: The artifact every version has, and the one converted.
SOURCE_ARTIFACT = "fp32"
#: Distinct runtimes (targets) one version is converted for, at most.
MAX_TARGETS_PER_VERSION = 4
#: Conversions remembered (under way, done or failed), at most; the oldest failures go first.
MAX_TRIED = 1024
#: How long after a failure that may not recur (storage, a deleted version) it is tried again.
RETRY_AFTER_S = 30.0


def target_name(runtime: RuntimeLimits) -> str:
    """The converted artifact's name for ``runtime``: ``fp32-ir9-opset18-ml3`` (no ``-ml``
    part when the runtime did not say): runtimes that differ only in their ``ai.onnx.ml``
    opset get artifacts of their own, since an ML opset the converter cannot lower is a
    reason for one and not the other."""
    ml = runtime.max_opset(ML_DOMAIN)
    name = f"{SOURCE_ARTIFACT}-ir{runtime.max_ir_version}-opset{runtime.max_opset(DEFAULT_DOMAIN)}"
    return name if ml is None else f"{name}-ml{ml}"


def _is_target(artifact: str) -> bool:
    return artifact.startswith(f"{SOURCE_ARTIFACT}-ir")


class _Unconvertible(CentralError):
    """A conversion that fails the same way whenever it is tried: its reason is kept."""


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
        retry_after_s: float = RETRY_AFTER_S,
    ) -> None:
        """``on_change``: called on the event loop once a converted artifact is stored, and
        when a conversion that failed for a passing reason may be tried again."""
        self._store = store
        self._blobs = blobs
        self._chunker = chunker
        self._signer = signer
        self._on_change = on_change
        self._transaction = transaction
        #: (name, version, artifact) → None while converting, else why it cannot be.
        self._tried: dict[tuple[str, str, str], str | None] = {}
        #: (name, version, artifact) → when a conversion that failed for a passing reason may run again.
        self._retry_at: dict[tuple[str, str, str], float] = {}
        self._retry_after_s = retry_after_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._retries: set[asyncio.TimerHandle] = set()

    def request(self, manifest: Manifest, runtime: RuntimeLimits) -> str | None:
        """Why ``manifest`` cannot be converted for ``runtime`` (None: under way, or done and
        soon in the manifest, or to be tried again). The first request starts the conversion
        in the background. Asked only for a runtime that loads none of ``manifest``'s
        artifacts: when one of them is the artifact converted for it, that does not load either."""
        if runtime.max_opset(DEFAULT_DOMAIN) is None:
            return "the node did not say which ai.onnx opsets it loads"
        target = target_name(runtime)
        if manifest.artifact_named(target) is not None:
            return f"the artifact {target} converted for it does not load either"
        key = (manifest.name, manifest.version, target)
        if key in self._tried:
            return self._tried[key]
        if manifest.artifact_named(SOURCE_ARTIFACT) is None:
            return self._remember(key, f"it has no {SOURCE_ARTIFACT} artifact to convert")
        targets = {a.artifact for a in manifest.artifacts() if _is_target(a.artifact)}
        targets |= {k[2] for k, why in self._tried.items() if k[:2] == key[:2] and why is None}
        if len(targets) >= MAX_TARGETS_PER_VERSION:
            made = ", ".join(sorted(targets))
            return f"central converts a version for at most {MAX_TARGETS_PER_VERSION} runtimes ({made})"
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return None  # a passing failure: tried again soon
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asked off the event loop: the next ask on it starts the conversion
            return None
        self._retry_at.pop(key, None)
        self._remember(key, None)
        task = loop.create_task(self._convert(key, runtime), name=f"convert {key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    def _remember(self, key: tuple[str, str, str], why: str | None) -> str | None:
        """Keep ``why`` for ``key``, forgetting the oldest failures past ``MAX_TRIED``."""
        if key not in self._tried and len(self._tried) >= MAX_TRIED:
            for old in [k for k, reason in self._tried.items() if reason is not None][: max(1, MAX_TRIED // 8)]:
                del self._tried[old]
        self._tried[key] = why
        return why

    async def stop(self) -> None:
        """Wait for conversions under way (their threads cannot be cancelled)."""
        for handle in self._retries:
            handle.cancel()
        self._retries.clear()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _convert(self, key: tuple[str, str, str], runtime: RuntimeLimits) -> None:
        name, version, artifact = key
        try:
            added = await asyncio.to_thread(self._convert_and_store, name, version, artifact, runtime)
        except _Unconvertible as exc:  # the same every time: the node's failure from now on
            self._tried[key] = str(exc)
            log.warning("%s:%s cannot be converted for %s: %s", name, version, runtime.runtime, exc)
            return
        except Exception as exc:  # storage, a deleted version, a converter bug: forgotten, tried again later
            self._tried.pop(key, None)
            if len(self._retry_at) >= MAX_TRIED:
                now = time.monotonic()
                self._retry_at = {k: at for k, at in self._retry_at.items() if at > now}
            self._retry_at[key] = time.monotonic() + self._retry_after_s
            log.warning(
                "%s:%s: converting for %s failed (%s: %s); trying again in %.0f s",
                name, version, runtime.runtime, type(exc).__name__, exc, self._retry_after_s,
            )  # fmt: skip
            self._schedule_retry()
            return
        if added:
            log.warning("%s:%s converted to %s for nodes on %s", name, version, artifact, runtime.runtime)
            self._on_change()

    def _schedule_retry(self) -> None:
        """Re-place once the retry delay is over, so the waiting node asks again."""
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._retries.discard(handle)
            self._on_change()

        handle = loop.call_later(self._retry_after_s, fire)
        self._retries.add(handle)

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
        try:
            fitted, _ = fit_model(model, runtime)  # BadRequest with the reason when it cannot be
            onnx.checker.check_model(fitted)  # in memory: external data is the source's, unchanged
        except (BadRequest, onnx.checker.ValidationError) as exc:
            raise _Unconvertible(str(exc)) from exc
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
