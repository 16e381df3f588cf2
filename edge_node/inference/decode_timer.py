"""Times the decode speed of a language model's artifacts (``Manifest.kind`` decoder).

What a language model's weight-only artifacts change is the cost of a decode step: each
generated token reads every weight once, so a 4-bit MatMulNBits artifact can decode several
times as fast as FP32, or not at all, depending on the CPU's int8 dot products. Feeding a
decoder the tensor timer's dummy inputs would time something no client does (a 32-token
chunk over a 32-token cache), so each artifact is timed here as the generation engine runs
it: one session per artifact made by the engine's own ``DecoderRunner`` (same threads,
same in-place KV binding), a fixed :data:`PROMPT_TOKENS`-token prompt prefilled once, then
:data:`DECODE_STEPS` greedy decode steps at batch 1 and at batch 8, every round starting
again from the end of the prompt (the steps overwrite the same KV positions: nothing is
re-prefilled). Rounds are interleaved across the artifacts and each artifact's median
seconds per step counts, as in the tensor timer (``artifact_timer``), so ``choice.pick`` applies
the same rules: FP32 is the floor, and a candidate must beat it by ``min_speedup`` at both
batch sizes."""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from edge_node.generation.kv import BatchKV
from edge_node.generation.model import DecoderSpec
from edge_node.generation.runners import open_runner
from edge_node.generation.settings import EngineSettings
from edge_node.inference.choice import FP32, Timing
from edge_node.settings import ChoiceSettings

log = logging.getLogger(__name__)

__all__ = ["DECODE_STEPS", "PROMPT_TOKENS", "DecodeTimer", "tokens_per_s"]

#: Prompt tokens prefilled before the timed steps (a short chat turn's worth of KV).
PROMPT_TOKENS = 32
#: Decode steps per timed run: enough that one run is not dominated by the timer's resolution.
DECODE_STEPS = 16
#: The batch sizes timed: one stream, and a few streams decoding together.
BATCHES = (1, 8)


def tokens_per_s(timing: Timing) -> tuple[float, float | None]:
    """Decode tokens/s of a :class:`Timing` whose figures are seconds per step (batch 1, batch 8)."""
    b8 = None if timing.b8_s is None else max(BATCHES) / timing.b8_s
    return 1.0 / timing.b1_s, b8


class _Decoder:
    """One artifact's session and KV buffer, with the prompt prefilled in every row."""

    def __init__(self, artifact: str, model: Path, engine: EngineSettings) -> None:
        self.artifact = artifact
        # The store names every artifact's graph ``model.onnx``; the config next to it says the rest.
        spec = dataclasses.replace(DecoderSpec.from_folder(model.parent), filename=model.name)
        self.runner = open_runner(model.parent, spec, engine)
        rows = max(BATCHES)
        tokens = PROMPT_TOKENS + DECODE_STEPS
        self.kv = BatchKV(spec.layers, rows, spec.kv_heads, spec.head_size, self.runner.kv_dtype, tokens, tokens)
        self.kv.ensure(tokens, 0)
        # Rows start from different prompts (as different clients' would); ids stay within the vocabulary.
        prompt = np.arange(PROMPT_TOKENS, dtype=np.int64) % spec.vocab_size
        self.first = np.empty(rows, dtype=np.int64)
        for row in range(rows):
            ids = ((prompt + row * 7) % spec.vocab_size).tolist()
            self.first[row] = int(np.argmax(self.runner.prefill(self.kv, row, ids, 0)))
        self.runs: dict[int, list[float]] = {b: [] for b in BATCHES}

    def run(self, batch: int) -> float:
        """``DECODE_STEPS`` greedy steps of rows 0…batch-1 from the end of the prompt; seconds per step."""
        tokens = self.first[:batch].copy()
        lengths = np.full(batch, PROMPT_TOKENS, dtype=np.int64)
        started = time.perf_counter()
        for _ in range(DECODE_STEPS):
            logits = self.runner.decode(self.kv, batch, tokens, lengths)
            tokens = np.argmax(logits, axis=-1).astype(np.int64)
            lengths += 1
        return (time.perf_counter() - started) / DECODE_STEPS

    def timing(self) -> Timing:
        return Timing(self.artifact, statistics.median(self.runs[1]), statistics.median(self.runs[8]))


class DecodeTimer:
    """Decode seconds per step of each of a language model's artifacts; blocking (the caller,
    ``ArtifactTimer``, runs one timing at a time in a worker thread)."""

    def __init__(
        self,
        engine: EngineSettings,
        settings: ChoiceSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The engine's settings: the sessions timed are made as the served one will be.
        self.engine = engine
        self.settings = settings or ChoiceSettings()
        self._clock = clock

    def time(self, candidates: Mapping[str, Path]) -> dict[str, Timing]:
        """Median seconds per decode step at batch 1 and 8 of each artifact of ``candidates``
        (artifact → its ``model.onnx``, the GenAI folder's other files beside it). Artifacts
        that fail to load or run are left out; ``ValueError`` if FP32 is among them."""
        opened = self._open(candidates)
        if FP32 not in opened:
            raise ValueError("FP32 did not load: there is nothing to compare the weight-only artifacts with")
        s = self.settings
        deadline = self._clock() + s.budget_s
        decoders = list(opened.values())
        for round_no in range(s.max_rounds):
            if round_no >= s.min_rounds and self._clock() >= deadline:
                break
            for batch in BATCHES:
                for d in decoders:
                    d.runs[batch].append(d.run(batch))
        return {d.artifact: d.timing() for d in decoders}

    def _open(self, candidates: Mapping[str, Path]) -> dict[str, _Decoder]:
        opened: dict[str, _Decoder] = {}
        for artifact, model in candidates.items():
            try:
                decoder = _Decoder(artifact, model, self.engine)
                for batch in BATCHES:
                    for _ in range(self.settings.warmup_runs):
                        decoder.run(batch)
            except Exception as exc:  # a candidate that cannot run here is no candidate
                log.warning("artifact %s left out of the choice: %s: %s", artifact, type(exc).__name__, exc)
                continue
            opened[artifact] = decoder
        return opened
