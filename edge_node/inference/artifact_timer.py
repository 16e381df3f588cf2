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
central's default."""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from edge_node.inference.session import SessionFactory, session_specs
from edge_node.settings import ChoiceSettings
from fleetwire.manifest import TensorSpec
from fleetwire.mqtt.payloads import MAX_CHOICE_REASON, ArtifactChoiceInfo

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

#: The manifest label an operator pins an artifact with (``--label modelfleet.artifact=fp32``):
#: every node serves it, timed or not, even when slower than FP32. Signed with the manifest.
PIN_LABEL = "modelfleet.artifact"
FP32 = "fp32"
#: The batch sizes timed: single requests, and what the dynamic batcher makes under load.
BATCHES = (1, 8)

#: Where a served artifact's choice came from.
ChoiceSource = Literal["measured", "verdict", "pinned", "only", "default", "central"]


@dataclass(frozen=True)
class ArtifactChoice:
    """Which artifact a node serves for one version, and why."""

    artifact: str
    hardware_class: str
    source: ChoiceSource
    reason: str
    speedup_b1: float | None = None
    """FP32's time over the chosen artifact's at batch 1 (None: not timed)."""
    speedup_b8: float | None = None
    """The same at batch 8 (None: not timed, or the model's batch axis is fixed)."""
    from_node: str | None = None
    """The node whose timing this is (a verdict shared through central: another node)."""

    def info(self) -> ArtifactChoiceInfo:
        """The heartbeat's form (the reason cut to the payload's limit)."""
        return ArtifactChoiceInfo(**{**self.as_json(), "reason": self.reason[:MAX_CHOICE_REASON]})

    def as_json(self) -> dict[str, Any]:
        """The form kept on disk and sent in heartbeats."""
        return {k: v for k, v in vars(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArtifactChoice:
        """The inverse of ``as_json``; ``KeyError``/``TypeError`` on a malformed record."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Timing:
    """Median seconds per run of one artifact at batch 1 and batch 8 (None: not timed)."""

    artifact: str
    b1_s: float
    b8_s: float | None


def _speedup(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or other <= 0:
        return None
    return round(base / other, 3)


def pick(timings: Mapping[str, Timing], hardware_class: str, node_id: str, min_speedup: float) -> ArtifactChoice:
    """The fastest artifact of ``timings``, never one slower than FP32 (which must be timed).

    An INT8 artifact qualifies when it is at least ``min_speedup`` times as fast as FP32 at
    every batch size timed; among those (and FP32, at 1.0) the best geometric mean of the
    speed-ups wins."""
    base = timings[FP32]
    speedups = {a: (_speedup(base.b1_s, t.b1_s), _speedup(base.b8_s, t.b8_s)) for a, t in timings.items()}

    def score(artifact: str) -> float:
        found = [s for s in speedups[artifact] if s is not None]
        return math.prod(found) ** (1 / len(found)) if found else 0.0

    qualified = [a for a, s in speedups.items() if a == FP32 or all(x >= min_speedup for x in s if x is not None)]
    best = max(qualified, key=lambda a: (score(a), a == FP32))
    b1, b8 = speedups[best]
    return ArtifactChoice(
        artifact=best,
        hardware_class=hardware_class,
        source="measured",
        reason=f"fastest of {len(timings)} on this node",
        speedup_b1=b1,
        speedup_b8=b8,
        from_node=node_id,
    )


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
    ) -> None:
        self._factory = factory
        self.hardware_class = hardware_class
        self.node_id = node_id
        self.settings = settings or ChoiceSettings()
        self._clock = clock
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
                self._factory.cache_path(key).unlink(missing_ok=True)
        summary = ", ".join(f"{t.artifact} {t.b1_s * 1e3:.2f}/{(t.b8_s or 0) * 1e3:.2f} ms" for t in timings.values())
        log.info("chose %s (%s); b1/b8 medians: %s", choice.artifact, choice.reason, summary)
        return choice

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
