"""INT8 watched on live traffic: a small sample of the requests an INT8 artifact served is
run again on the version's FP32 artifact, off the serving path, and how far the two agree
is counted (``fleetwire.agreement``, the accuracy guard's own measures) for the heartbeat.

Central judges the counts across nodes and may send the version back to FP32
(``force_artifact``). The cost on the serving path is one ``random()`` draw per request;
a sampled request's tensors are copied into a small bounded queue (dropped and counted
when it is full, never waited on) and one background thread runs them on a plain CPU
session with one intra-op thread, so the reference never takes the cores serving uses.

The thread gathers samples for up to ``GATHER_S`` (or ``BATCH_ROWS`` rows) and runs them as
one batch: a large model at batch 1 is bound by reading its weights, which a batch reads once
(a 117 MB FP32 MLP at 1 % of ~1,400 req/s on 2 cores: 6 % fewer req/s run one by one).

The same sampler proves a *pending* INT8 candidate (one the guard could not prove on too
few samples, ``Manifest.pending``): FP32 serves, the candidate runs on the sample, and the
counts (``ShadowInfo.candidate`` set) let central promote it (``central.rollout.promotion``).

FP32 of a sample can still cost several times what serving the request did (that MLP: ~5x,
so 1 % sampled took ~5 % of the edge's CPU). So the worker keeps to a CPU budget: after each
batch it rests until its CPU time is at most ``cpu_share`` of the node's cores; samples beyond
what the queue holds meanwhile are dropped and counted (``ShadowInfo.dropped``), so central sees
how far the sample fell short. The thread keeps the default priority: it holds the GIL between
ORT calls, and descheduled at nice 19 it stalled the event loop (priority inversion)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort

from fleetwire.agreement import per_sample
from fleetwire.manifest import ArtifactRef, Manifest, TensorSpec
from fleetwire.mqtt.payloads import ShadowInfo

log = logging.getLogger(__name__)

__all__ = [
    "DRIFT_POLICY_LABEL",
    "REFERENCE_ARTIFACT",
    "LiveShadow",
    "ShadowFactory",
    "ShadowSampler",
    "reference_session",
    "shadow_candidate",
    "shadow_companion",
    "shadow_reference",
]

#: The artifact INT8 is checked against.
REFERENCE_ARTIFACT = "fp32"
#: Manifest label; ``off`` turns live sampling off for the version.
DRIFT_POLICY_LABEL = "modelfleet.drift_policy"
#: How long the worker gathers samples before running them as one batch (seconds).
GATHER_S = 1.0
#: Most rows run in one reference batch (the edge's default largest batch).
BATCH_ROWS = 32
#: The worker's CPU time at most, as a share of the node's cores.
CPU_SHARE = 0.01

_Sample = tuple[dict[str, np.ndarray], list[np.ndarray]]

Tensors = Mapping[str, np.ndarray]


class LiveShadow(Protocol):
    """What the repository and the heartbeat need of a version's live shadow: a tensor model's
    :class:`ShadowSampler`, or a language model's ``GenerationShadow``
    (``edge_node.generation.shadow``)."""

    def info(self) -> ShadowInfo:
        """The counts so far."""
        ...

    def close(self) -> None:
        """Stop the worker and release the reference."""
        ...


#: Makes a language model's shadow from its FP32 reference's folder (``GenerationShadow.open``).
TextShadowMaker = Callable[..., LiveShadow]


def shadow_reference(manifest: Manifest, served: str, sample: float) -> ArtifactRef | None:
    """The artifact ``served`` (an artifact of ``manifest``) is checked against on live traffic,
    or None: sampling is off, the served artifact is not quantized, the version has no FP32
    artifact, or its label ``modelfleet.drift_policy`` is ``off``."""
    if sample <= 0 or served == REFERENCE_ARTIFACT or manifest.labels.get(DRIFT_POLICY_LABEL) == "off":
        return None
    chosen = manifest.artifact_named(served)
    if chosen is None or chosen.quantization is None:
        return None
    return manifest.artifact_named(REFERENCE_ARTIFACT)


def shadow_candidate(manifest: Manifest, served: str, sample: float) -> ArtifactRef | None:
    """The pending INT8 candidate run beside ``served`` (FP32) on live traffic, or None: sampling
    is off, FP32 is not what is served, nothing is pending, or the drift policy is ``off``."""
    if sample <= 0 or served != REFERENCE_ARTIFACT or manifest.labels.get(DRIFT_POLICY_LABEL) == "off":
        return None
    return manifest.pending[0] if manifest.pending else None


def shadow_companion(manifest: Manifest, served: str, sample: float) -> ArtifactRef | None:
    """The artifact assembled beside ``served`` for the live shadow: FP32 beside a served INT8
    (the reference), or the pending candidate beside a served FP32; None when not sampled."""
    return shadow_reference(manifest, served, sample) or shadow_candidate(manifest, served, sample)


def reference_session(path: Path) -> ort.InferenceSession:
    """A plain CPU session with one thread each way: the reference must not compete with
    the serving sessions for cores."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass
class _Counts:
    """``ShadowInfo``'s counts while they grow (the payload itself is frozen)."""

    samples: int = 0
    top1_agree: int = 0
    top1_samples: int = 0
    measure: str = ""
    measure_sum: float = 0.0
    measure_sumsq: float = 0.0
    dropped: int = 0


class ShadowSampler:
    """Samples one served INT8 version's requests and compares them with its FP32 reference.

    ``offer`` is called after each request completed; ``info`` is what the heartbeat reports;
    ``close`` stops the worker (what is queued then is not run)."""

    def __init__(
        self,
        reference: ort.InferenceSession,
        outputs: Sequence[TensorSpec],
        *,
        sample: float,
        queue_size: int = 8,
        reference_name: str = REFERENCE_ARTIFACT,
        name: str = "shadow",
        gather_s: float = GATHER_S,
        batch_rows: int = BATCH_ROWS,
        cpu_share: float = CPU_SHARE,
        candidate: str = "",
    ) -> None:
        """``reference`` is the session run on each sample: the FP32 reference of a served INT8,
        or, with ``candidate`` (its artifact name), the pending candidate beside a served FP32
        (then the served outputs are the reference the candidate's are compared with)."""
        self.sample = sample
        self._candidate = candidate
        self._gather_s = gather_s
        self._batch_rows = batch_rows
        #: CPU seconds the worker may use per second of wall time (0 or less: no limit).
        self._cpu_per_s = cpu_share * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        self._session = reference
        # Samples stack into one batch only on a variable first axis.
        self._stackable = all(not isinstance(i.shape[0], int) if i.shape else False for i in reference.get_inputs())
        self._outputs = list(outputs)
        self._input_names = [i.name for i in reference.get_inputs()]
        self._queue: queue.Queue[_Sample | None] = queue.Queue(maxsize=max(1, queue_size))
        self._lock = threading.Lock()
        self._reference_name = reference_name
        self._counts = _Counts()
        self._failed = False
        self._closed = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def offer(self, inputs: Tensors, outputs: Tensors) -> None:
        """Maybe sample one completed request (all its rows); never blocks."""
        if random.random() >= self.sample or self._closed:
            return
        try:
            kept = {k: np.array(inputs[k], copy=True) for k in self._input_names}
            got = [np.array(outputs[o.name], copy=True) for o in self._outputs]
        except KeyError:  # an output the version does not give: nothing to compare
            return
        try:
            self._queue.put_nowait((kept, got))
        except queue.Full:
            with self._lock:
                self._counts.dropped += 1

    def info(self) -> ShadowInfo:
        """The counts so far."""
        with self._lock:
            return ShadowInfo(reference=self._reference_name, candidate=self._candidate, **asdict(self._counts))

    def join(self) -> None:
        """Wait until every queued sample was compared (tests and benchmarks)."""
        self._queue.join()

    def close(self) -> None:
        """Stop the worker: queued samples are dropped, the reference session released."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        while True:
            try:
                self._queue.get_nowait()
                self._queue.task_done()
            except queue.Empty:
                break
        with contextlib.suppress(queue.Full):  # refilled meanwhile: the closing flag stops the worker
            self._queue.put_nowait(None)
        self._thread.join(timeout=10)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                self._queue.task_done()
                return
            gathered, stop = self._gather(first)
            started = time.thread_time()
            try:
                for inputs, got in self._stacked(gathered):
                    self._compare(inputs, got)
            finally:
                for _ in range(len(gathered) + stop):
                    self._queue.task_done()
            if stop or self._rest(time.thread_time() - started):
                return

    def _rest(self, cpu_s: float) -> bool:
        """Rest so that ``cpu_s`` just spent stays within the budget; True once closed."""
        if self._cpu_per_s <= 0 or self._cpu_per_s >= 1:
            return self._closed
        self._closing.wait(cpu_s / self._cpu_per_s - cpu_s)
        return self._closed

    def _gather(self, first: _Sample) -> tuple[list[_Sample], bool]:
        """``first`` and what arrives within ``gather_s`` up to ``batch_rows`` rows; and whether
        ``close`` was met on the way."""
        gathered, rows = [first], _rows(first)
        deadline = time.monotonic() + self._gather_s
        while rows < self._batch_rows:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                return gathered, True
            gathered.append(item)
            rows += _rows(item)
        return gathered, False

    def _stacked(self, gathered: list[_Sample]) -> list[_Sample]:
        """``gathered`` as one batch when their shapes allow it, else as they are."""
        if len(gathered) == 1 or not self._stackable:
            return gathered
        first_in, first_out = gathered[0]
        for inputs, got in gathered[1:]:
            if any(v.ndim == 0 or v.shape[1:] != first_in[k].shape[1:] or v.dtype != first_in[k].dtype
                   for k, v in inputs.items()):  # fmt: skip
                return gathered
            if any(g.ndim == 0 or g.shape[1:] != f.shape[1:] for g, f in zip(got, first_out, strict=True)):
                return gathered
        inputs = {k: np.concatenate([g[0][k] for g in gathered]) for k in first_in}
        got = [np.concatenate([g[1][i] for g in gathered]) for i in range(len(first_out))]
        return [(inputs, got)]

    def _compare(self, inputs: dict[str, np.ndarray], got: list[np.ndarray]) -> None:
        try:
            ran = [np.asarray(r) for r in self._session.run([o.name for o in self._outputs], inputs)]
            reference, checked = (got, ran) if self._candidate else (ran, got)
            agreement = per_sample(self._outputs, reference, checked)
        except Exception as exc:  # the reference failing must never touch serving; said once
            if not self._failed:
                self._failed = True
                log.warning("shadow %s: the reference run failed (%s); skipping such samples", self._thread.name, exc)
            return
        values = agreement.values.astype(np.float64)
        with self._lock:
            info = self._counts
            info.samples += int(values.size)
            info.measure = agreement.measure
            info.measure_sum += float(np.sum(values))
            info.measure_sumsq += float(np.sum(values**2))
            if agreement.top1 is not None:
                info.top1_samples += int(agreement.top1.size)
                info.top1_agree += int(np.sum(agreement.top1))


def _rows(sample: _Sample) -> int:
    first = next(iter(sample[0].values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


class ShadowFactory:
    """Makes the sampler of a version as it loads, when it is shadowed: its served artifact
    is INT8 and the FP32 reference was assembled beside it (``<version>/<artifact>/model.onnx``),
    or it serves FP32 and a pending INT8 candidate was assembled beside it. A language model's
    quantized artifact gets ``text``'s shadow (``GenerationShadow.open``) on its FP32 folder."""

    def __init__(
        self, sample: float, queue_size: int, cpu_share: float = CPU_SHARE, text: TextShadowMaker | None = None
    ) -> None:
        self.sample = sample
        self.queue_size = queue_size
        self.cpu_share = cpu_share
        self.text = text

    def __call__(self, manifest: Manifest, path: Path) -> LiveShadow | None:
        """The sampler of ``manifest`` (as it is served) loaded from ``path``, or None (blocking)."""
        companion = shadow_companion(manifest, manifest.artifact, self.sample)
        if companion is None:
            return None
        companion_path = path.parent.parent / companion.artifact / path.name
        if not companion_path.is_file():
            log.info("%s:%s: no %s on disk, not sampled", manifest.name, manifest.version, companion.artifact)
            return None
        name = f"shadow {manifest.name}:{manifest.version}"
        pending = companion.artifact if manifest.artifact == REFERENCE_ARTIFACT else ""
        if manifest.is_language_model:  # a pending candidate beside a served FP32 is not run for text
            if self.text is None or pending:
                return None
            return self.text(
                companion_path.parent, sample=self.sample, queue_size=self.queue_size, cpu_share=self.cpu_share,
                name=name,
            )  # fmt: skip
        return ShadowSampler(
            reference_session(companion_path),
            manifest.outputs,
            sample=self.sample,
            queue_size=self.queue_size,
            reference_name=REFERENCE_ARTIFACT,
            cpu_share=self.cpu_share,
            name=name,
            candidate=pending,
        )
