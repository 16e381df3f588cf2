"""ONNX Runtime sessions with a per-host cache of the fully optimized model.

``ORT_ENABLE_ALL`` includes layout transformations (NCHWc) and fusions chosen for the
execution providers and CPU at hand; ORT itself warns that a model serialized after
them "may contain hardware specific optimizations, and should only be used in the same
environment the model was optimized in". So the cache key is the model's identity
(e.g. its sha256) *plus* the provider list, the onnxruntime version and a fingerprint
of the host (machine, CPU flags, GPU models). On a restart the cached model is loaded
with only the cheap ``ORT_ENABLE_BASIC`` level, which cuts session start-up; a cache
entry that fails to load is discarded and rebuilt from the original.

A cache entry is the optimized model file plus, when it has initializers of
``EXTERNAL_INITIALIZER_MIN_BYTES`` or more, one data file beside it. Without that data
file ORT would write references to the *original* model's external data
(``model.onnx.data``) relative to the cache entry, where it does not exist, and every
warm start would discard the entry and optimize again. Each creation writes its own data
file (``<entry>.<token>.data``) before the model file is renamed into place, so
concurrent creators never share one; the replaced entry's data file is removed under a
lock that loads from the cache share, so no load loses its data file half-way. A creation
killed mid-way leaves its temporary model and data files; each factory removes those of dead
processes (by the pid in their name) the first time it uses the cache dir."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from fleetwire.manifest import Manifest, TensorSpec

log = logging.getLogger(__name__)

#: Session log severity: FATAL. Normal loads print nothing (ORT warns on every
#: serialization of an ENABLE_ALL model and on node placement), and a run that fails
#: prints nothing either: ORT logs at ERROR every request a kernel refuses (a token id
#: past the vocabulary), so any client could fill the log, and every such error is also
#: raised, then answered (400) or logged (500) by the edge, as are load failures.
SESSION_LOG_SEVERITY = 4
#: Protobuf cannot serialize a single-file model of 2 GiB or more; larger models are
#: served without the cache rather than failing to load.
MAX_CACHEABLE_BYTES = 1_800_000_000
#: Initializers of this size or more go to the cache entry's data file, the rest stay in
#: the model file (ORT's own default threshold for external initializers).
EXTERNAL_INITIALIZER_MIN_BYTES = 1024
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: A dead creator's temporary files younger than this are kept (see ``_sweep_crashed``).
STALE_TEMP_S = 600.0
#: A creation's temporary model file: ``.<stem>.<pid>-<hex8>.tmp.onnx``.
_TMP = re.compile(r"\.(.+)\.(\d+)-([0-9a-f]{8})\.tmp\.onnx")
_PROVIDER_TAGS = {"TensorrtExecutionProvider": "trt", "CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cpu_flags() -> str:
    """The CPU feature flags (x86 ``flags`` / ARM ``Features``), or ``""`` if unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return " ".join(sorted(value.split()))
    return ""


def _gpu_models() -> str:
    """GPU model names from the NVIDIA driver's proc files (no CUDA call needed)."""
    models = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            models += [ln for ln in info.read_text(errors="replace").splitlines() if ln.startswith("Model:")]
        except OSError:
            continue
    return "|".join(models)


@functools.cache
def host_fingerprint() -> str:
    """A short hash of what an optimized model may depend on: machine, CPU flags, GPUs."""
    raw = "\n".join((platform.machine(), _cpu_flags(), _gpu_models()))
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CreatedSession:
    """A session and how it was made: from the cache (``cache_hit``) or optimized anew."""

    session: ort.InferenceSession
    cache_hit: bool
    cache_path: Path | None


class SessionFactory:
    """Creates sessions for one provider set, caching optimized models in ``cache_dir``.

    Safe to call from several threads and processes: two concurrent creations of the same
    key each write their own temporary model file and data file and atomically rename the
    model file (last one wins; both are valid), so a reader never sees a half-written
    entry. ``cache_dir/.lock`` (flock) orders the rename and the removal of the replaced
    entry's data file (exclusive) against loads from the cache (shared)."""

    def __init__(
        self, cache_dir: Path, providers: list[str], intra_op_threads: int = 0, inter_op_threads: int = 1
    ) -> None:
        if not providers:
            raise ValueError("at least one execution provider is required")
        self.cache_dir = Path(cache_dir)
        self.providers = list(providers)
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        #: Whether the most recent ``create`` (from any thread) was served from the cache;
        #: None before the first. Concurrent callers should use ``create_with_info``.
        self.last_cache_hit: bool | None = None
        #: Whether this factory removed crashed creations' leftovers (once, at first use).
        self._swept = False

    def cache_path(self, key: str) -> Path:
        """Where the optimized model for ``key`` lives on this host and provider set."""
        tags = "+".join(_PROVIDER_TAGS.get(p, _SAFE.sub("_", p)) for p in self.providers)
        name = f"{_SAFE.sub('_', key)}.{tags}.ort{ort.__version__}.{host_fingerprint()}.onnx"
        return self.cache_dir / name

    def entry_files(self, key: str) -> list[Path]:
        """The files of ``key``'s cache entry on disk: the model file and its data files
        (the live one and any of a creation still in progress)."""
        cached = self.cache_path(key)
        return [p for p in (cached, *sorted(self._data_files(cached).values())) if p.exists()]

    def discard(self, key: str) -> None:
        """Remove ``key``'s cache entry, its data file included (creations in progress
        keep theirs and install their entry as usual)."""
        if not self.cache_dir.is_dir():
            return
        with self._lock(fcntl.LOCK_EX):
            cached = self.cache_path(key)
            cached.unlink(missing_ok=True)
            self._prune_data(cached, keep=None)

    def create(self, model_path: Path, key: str) -> ort.InferenceSession:
        """A session for ``model_path``; ``last_cache_hit`` tells whether it was cached."""
        return self.create_with_info(model_path, key).session

    def create_with_info(self, model_path: Path, key: str, total_bytes: int | None = None) -> CreatedSession:
        """A session plus whether the optimized model came from the cache. ``total_bytes``:
        the model's size with its external-data files (ORT finds them next to ``model_path``).
        It counts toward ``MAX_CACHEABLE_BYTES`` although the optimized copy's large
        initializers now go to its data file: caching beyond 2 GiB is untried."""
        cached = self.cache_path(key)
        self._sweep_crashed()
        result = self._from_cache(cached) if cached.is_file() else None
        if result is None:
            result = self._optimize(Path(model_path), cached, total_bytes)
        self.last_cache_hit = result.cache_hit
        return result

    def _options(self, level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.log_severity_level = SESSION_LOG_SEVERITY
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = self.inter_op_threads
        if self.inter_op_threads > 1:
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        # Spinning intra-op threads burn a core between batches; on an edge that core is
        # what the HTTP loop needs. Batches arrive every few ms, so waking costs little.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    def _session(self, path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
        return ort.InferenceSession(str(path), options, providers=self.providers)

    @contextlib.contextmanager
    def _lock(self, mode: int) -> Iterator[None]:
        """``cache_dir/.lock`` held in ``mode`` (``LOCK_SH``/``LOCK_EX``); the dir must exist."""
        with open(self.cache_dir / ".lock", "a+b") as handle:
            fcntl.flock(handle, mode)
            yield  # closing the file releases the lock

    def _data_files(self, cached: Path) -> dict[str, Path]:
        """The data files written for ``cached`` by any creation, by creation token."""
        pattern = re.compile(re.escape(cached.name) + r"\.(\d+-[0-9a-f]{8})\.data")
        found = {}
        for path in cached.parent.glob(f"{cached.name}.*.data"):
            match = pattern.fullmatch(path.name)
            if match:
                found[match.group(1)] = path
        return found

    def _prune_data(self, cached: Path, keep: str | None) -> None:
        """Remove ``cached``'s data files but the one of creation ``keep`` and those of
        creations still in progress (their temporary model file exists). Hold the lock
        exclusively: a replaced entry's data file goes, a crashed creation's too."""
        for token, path in self._data_files(cached).items():
            if token != keep and not self._tmp_path(cached, token).exists():
                path.unlink(missing_ok=True)

    def _sweep_crashed(self) -> None:
        """Once per factory: remove the temporary model files (and their data files) of
        creations whose process is gone. A creation killed mid-optimisation leaves both, and
        no later creation of the same key prunes the data file while the temporary one
        exists, so without this they stay forever. A creation's token starts with its pid;
        a live pid (or one of another user's process) keeps its files, and so does one
        touched within ``STALE_TEMP_S`` (a creator in another PID namespace sharing the dir,
        whose pid means nothing here)."""
        if self._swept or not self.cache_dir.is_dir():
            return
        self._swept = True
        try:
            with self._lock(fcntl.LOCK_EX):
                for tmp in self.cache_dir.glob(".*.tmp.onnx"):
                    match = _TMP.fullmatch(tmp.name)
                    if match is None or _alive(int(match.group(2))):
                        continue
                    try:
                        if time.time() - tmp.stat().st_mtime < STALE_TEMP_S:
                            continue
                    except FileNotFoundError:  # its creation just finished
                        continue
                    stem, token = match.group(1), f"{match.group(2)}-{match.group(3)}"
                    tmp.unlink(missing_ok=True)
                    (self.cache_dir / f"{stem}.onnx.{token}.data").unlink(missing_ok=True)
                    log.info("removed %s, left by a creation that did not finish", tmp)
        except OSError as exc:  # a read-only or vanished cache dir: creations report it themselves
            log.warning("cannot sweep the optimized-model cache %s: %s", self.cache_dir, exc)

    @staticmethod
    def _tmp_path(cached: Path, token: str) -> Path:
        # The suffix must stay ".onnx": ORT picks the output format from it (".ort" → ORT).
        return cached.with_name(f".{cached.stem}.{token}.tmp.onnx")

    def _from_cache(self, cached: Path) -> CreatedSession | None:
        """The cached optimized model, or None (and the entry removed) if it won't load."""
        loaded: os.stat_result | None = None  # the entry that failed to load, when stat told
        with self._lock(fcntl.LOCK_SH):
            try:
                loaded = cached.stat()
                session = self._session(cached, self._options(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC))
                return CreatedSession(session, True, cached)
            except FileNotFoundError:  # removed meanwhile (a discard): nothing to discard
                return None
            except Exception as exc:
                log.warning("discarding unusable optimized-model cache %s: %s", cached, exc)
        with self._lock(fcntl.LOCK_EX), contextlib.suppress(OSError):
            now = cached.stat()
            # Not a newer entry. An entry that could not even be stat'ed is left alone (the
            # optimized model is rebuilt and replaces it; removing it blind could drop a newer one).
            if loaded is not None and (now.st_ino, now.st_mtime_ns) == (loaded.st_ino, loaded.st_mtime_ns):
                cached.unlink()
                self._prune_data(cached, keep=None)
        return None

    def _optimize(self, model_path: Path, cached: Path, total_bytes: int | None = None) -> CreatedSession:
        """Load with ENABLE_ALL, writing the optimized model (and its data file) into the
        cache: the model file appears atomically, its data file before it."""
        options = self._options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        if not self._cacheable(model_path, total_bytes):
            return CreatedSession(self._session(model_path, options), False, None)
        token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = self._tmp_path(cached, token)
        data = cached.with_name(f"{cached.name}.{token}.data")
        tmp.touch()  # marks the creation in progress: no pruning takes its data file meanwhile
        options.optimized_model_filepath = str(tmp)
        # Relative to the model file; the same directory, so the rename keeps it valid.
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data.name)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", str(EXTERNAL_INITIALIZER_MIN_BYTES)
        )
        installed = False
        try:
            session = self._session(model_path, options)
            with self._lock(fcntl.LOCK_EX):
                os.replace(tmp, cached)
                installed = True
                self._prune_data(cached, keep=token)
        finally:
            tmp.unlink(missing_ok=True)
            if not installed:
                data.unlink(missing_ok=True)
        return CreatedSession(session, False, cached)

    def _cacheable(self, model_path: Path, total_bytes: int | None = None) -> bool:
        """Whether to write a cache entry: a usable cache dir and a serializable size."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            too_big = max(model_path.stat().st_size, total_bytes or 0) >= MAX_CACHEABLE_BYTES
        except OSError as exc:
            log.warning("optimized-model cache disabled for %s: %s", model_path, exc)
            return False
        if too_big:
            log.info("not caching the optimized form of %s: too large for one protobuf", model_path)
        return not too_big


_ORT_TO_NUMPY = {
    "float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "bool": "bool", "string": "object",
}  # fmt: skip


def _spec(arg: ort.NodeArg) -> TensorSpec:
    """A session input/output as a TensorSpec; symbolic or unknown dims become -1."""
    inner = arg.type.removeprefix("tensor(").removesuffix(")")
    shape = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]
    return TensorSpec(name=arg.name, dtype=_ORT_TO_NUMPY.get(inner, inner), shape=shape)


def session_specs(session: ort.InferenceSession) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The session's real ``(inputs, outputs)`` in manifest form."""
    return [_spec(a) for a in session.get_inputs()], [_spec(a) for a in session.get_outputs()]


def dummy_inputs(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """A one-row batch of zeros matching ``specs`` (variable dims → 1), for warm-up."""
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(d if d >= 0 else 1 for d in spec.shape)
        if spec.dtype == "object":
            out[spec.name] = np.full(shape, "", dtype=object)
        else:
            out[spec.name] = np.zeros(shape, dtype=np.dtype(spec.dtype))
    return out


def reconcile_manifest(manifest: Manifest, session: ort.InferenceSession) -> Manifest:
    """The manifest with the session's real signature, logging any disagreement."""
    inputs, outputs = session_specs(session)
    published = (manifest.inputs, manifest.outputs)
    if published != ([], []) and published != (inputs, outputs):
        log.warning(
            "%s version %s: manifest signature %s -> %s differs from the model's %s -> %s; using the model's",
            manifest.name, manifest.version, manifest.inputs, manifest.outputs, inputs, outputs,
        )  # fmt: skip
    return manifest.model_copy(update={"inputs": inputs, "outputs": outputs})


def batchable(manifest: Manifest) -> bool:
    """Whether every input and output has a variable first axis (concatenation-safe)."""
    return all(s.shape and s.shape[0] == -1 for s in (*manifest.inputs, *manifest.outputs))
