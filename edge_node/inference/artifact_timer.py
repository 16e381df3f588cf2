"""Times a version's artifacts on this node and picks the one to serve.

Whether an INT8 artifact pays off depends on the CPU (see ``hardware``): the same QDQ
model ran 1.9x FP32's speed on one machine and 0.7x on another. So the first node of a
hardware class loads every artifact that passed central's guard in an ONNX Runtime
session made exactly like the one it serves with (``SessionFactory``: same providers,
threads and optimization level), times batch 1 and batch 8 on inputs shaped from the
model's signature, and serves the fastest. FP32 is the floor: an INT8 artifact is chosen
only when it beats FP32 by ``min_speedup`` at every batch size timed, so measurement
noise cannot put a slower artifact in service. (An operator's pin overrides all this:
``PIN_LABEL``.)

The runs are interleaved, one run of every candidate per round, so a burst of other
work on the host slows all candidates alike instead of the one timed at that moment;
each candidate's median run counts. Rounds stop at ``max_rounds`` or once ``budget_s``
is spent (after ``min_rounds``), so a slow candidate bounds the time, not the result.
All candidates' sessions are open at once for that (INT8 ones are a quarter of FP32's
size): a node short of memory can turn timing off (``choice.enabled``) and serve
central's default.

A language model (``Manifest.kind`` decoder) is timed by what its weight-only artifacts
change, decode tokens/s (``decode_timer``), under the same rules (``choice.pick``)."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_node.generation.settings import EngineSettings
from edge_node.inference.choice import FP32, PIN_LABEL, ArtifactChoice, ChoiceSource, Timing, pick
from edge_node.inference.decode_timer import DecodeTimer, tokens_per_s
from edge_node.inference.session import SessionFactory, session_specs
from edge_node.settings import ChoiceSettings
from fleetwire.manifest import TensorSpec

log = logging.getLogger(__name__)

__all__ = [
    "FP32",
    "PIN_LABEL",
    "ArtifactChoice",
    "ArtifactTimer",
    "ChoiceSource",
    "Timing",
    "pick",
    "timing_inputs",
]

#: The batch sizes timed: single requests, and what the dynamic batcher makes under load.
BATCHES = (1, 8)


def timing_inputs(specs: list[TensorSpec], batch: int, free_dim: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``specs`` with a batch axis of ``batch`` (a variable first dimension) and
    ``free_dim`` for other variable dimensions. Floats are standard normal; integers are 1
    (a valid token id and an "attend" mask value); booleans are True."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(batch if i == 0 and d < 0 else (free_dim if d < 0 else d) for i, d in enumerate(spec.shape))
        dtype = np.dtype(spec.dtype) if spec.dtype != "object" else np.dtype(object)
        if dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[spec.name] = np.ones(shape, dtype=bool)
        elif dtype.kind == "O":
            out[spec.name] = np.full(shape, "a", dtype=object)
        else:
            out[spec.name] = np.ones(shape, dtype=dtype)
    return out


def _batchable(specs: list[TensorSpec]) -> bool:
    return all(s.shape and s.shape[0] < 0 for s in specs)


class _Candidate:
    """One artifact's open session, its inputs per batch size and its run times."""

    def __init__(self, artifact: str, session: ort.InferenceSession, free_dim: int) -> None:
        self.artifact = artifact
        self.session = session
        inputs, _ = session_specs(session)
        batches = BATCHES if _batchable(inputs) else BATCHES[:1]
        self.inputs = {b: timing_inputs(inputs, b, free_dim) for b in batches}
        self.runs: dict[int, list[float]] = {b: [] for b in batches}

    def run(self, batch: int) -> float:
        started = time.perf_counter()
        self.session.run(None, self.inputs[batch])
        return time.perf_counter() - started

    def timing(self) -> Timing:
        b8 = self.runs.get(8)
        return Timing(self.artifact, statistics.median(self.runs[1]), statistics.median(b8) if b8 else None)


class ArtifactTimer:
    """Times candidate artifacts in sessions made like the served ones; blocking (run it in
    a worker thread: it keeps the CPU busy for up to ``budget_s``)."""

    def __init__(
        self,
        factory: SessionFactory,
        hardware_class: str,
        node_id: str,
        settings: ChoiceSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        engine: EngineSettings | None = None,
    ) -> None:
        self._factory = factory
        self.hardware_class = hardware_class
        self.node_id = node_id
        self.settings = settings or ChoiceSettings()
        self._clock = clock
        #: Language models are timed by decode speed, in sessions made as ``engine`` makes them.
        self._decode = DecodeTimer(engine or EngineSettings(), self.settings, clock)
        #: One timing at a time: two versions timed at once would each measure the other too.
        self._lock = threading.Lock()

    def choose(self, candidates: Mapping[str, tuple[Path, str]]) -> ArtifactChoice:
        """The artifact to serve among ``candidates`` (artifact → model path and its sha256, the
        session cache key). Candidates that fail to load or run are left out; FP32 must load."""
        with self._lock:
            opened = self._open(candidates)
            if FP32 not in opened:
                raise ValueError("FP32 did not load: there is nothing to compare the INT8 artifacts with")
            timings = self._time(list(opened.values()))
        choice = pick(timings, self.hardware_class, self.node_id, self.settings.min_speedup)
        for artifact, (_, key) in candidates.items():  # the losers' optimized copies are never loaded again
            if artifact != choice.artifact:
                self._factory.discard(key)
        summary = ", ".join(f"{t.artifact} {t.b1_s * 1e3:.2f}/{(t.b8_s or 0) * 1e3:.2f} ms" for t in timings.values())
        log.info("chose %s (%s); b1/b8 medians: %s", choice.artifact, choice.reason, summary)
        return choice

    def choose_decoder(self, candidates: Mapping[str, Path]) -> ArtifactChoice:
        """The artifact to serve among a language model's ``candidates`` (artifact → its
        ``model.onnx``, the GenAI folder's files beside it), by decode tokens/s; the reason
        carries each artifact's tokens/s at batch 1 and 8. FP32 must load."""
        with self._lock:
            timings = self._decode.time(candidates)
        choice = pick(timings, self.hardware_class, self.node_id, self.settings.min_speedup)
        speeds = ", ".join(
            f"{t.artifact} {b1:.0f}/{b8 or 0:.0f}" for t in timings.values() for b1, b8 in [tokens_per_s(t)]
        )
        reason = f"fastest decode of {len(timings)} on this node (tokens/s b1/b8: {speeds})"
        log.info("chose %s (%s)", choice.artifact, reason)
        return replace(choice, reason=reason)

    def _open(self, candidates: Mapping[str, tuple[Path, str]]) -> dict[str, _Candidate]:
        opened: dict[str, _Candidate] = {}
        for artifact, (path, key) in candidates.items():
            try:
                candidate = _Candidate(artifact, self._factory.create(path, key), self.settings.free_dim)
                for batch in candidate.inputs:
                    for _ in range(self.settings.warmup_runs):
                        candidate.run(batch)
            except Exception as exc:  # a candidate that cannot run here is no candidate
                log.warning("artifact %s left out of the choice: %s: %s", artifact, type(exc).__name__, exc)
                continue
            opened[artifact] = candidate
        return opened

    def _time(self, candidates: list[_Candidate]) -> dict[str, Timing]:
        s = self.settings
        deadline = self._clock() + s.budget_s
        fp32 = next(c for c in candidates if c.artifact == FP32)
        batches = [b for b in BATCHES if b in fp32.inputs]  # a batch FP32 cannot run is not compared
        for round_no in range(s.max_rounds):
            if round_no >= s.min_rounds and self._clock() >= deadline:
                break
            for batch in batches:
                for c in candidates:
                    if batch in c.inputs:
                        c.runs[batch].append(c.run(batch))
        return {c.artifact: c.timing() for c in candidates if all(c.runs.get(b) for b in batches)}
