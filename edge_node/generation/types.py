"""What a caller of the generation engine hands in and gets back: sampling parameters, the
step outputs of a stream, the engine's counters, and the errors (each with its HTTP status).

These types are the contract between :class:`~edge_node.generation.GenerationEngine` and the
transports (OpenAI-compatible routes, the Open Inference Protocol's generate extension); they
import nothing of ONNX Runtime, so a transport can be written and typed against them alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from edge_node import errors

__all__ = [
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "BadSampling",
    "ContextTooLong",
    "EngineStats",
    "FinishReason",
    "GenerationError",
    "Overloaded",
    "SamplingParams",
    "StepOutput",
]

#: How many stop strings one request may give (OpenAI allows 4; a few more cost nothing).
MAX_STOP_STRINGS = 16
#: The longest stop string accepted, in characters.
MAX_STOP_STRING_CHARS = 256

FinishReason = Literal["stop", "length"]


class GenerationError(errors.EdgeError):
    """Base of the errors the generation engine raises to a caller; ``status`` is the HTTP status."""


class BadSampling(GenerationError, errors.InvalidRequest):
    """A sampling parameter out of range (``max_tokens`` ≤ 0, ``temperature`` < 0, ``top_p``
    outside (0, 1], too many stop strings…) or an empty prompt: 400. ``field`` names the
    parameter so a transport can point at it."""

    status = 400

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class ContextTooLong(GenerationError, errors.InvalidRequest):
    """The prompt plus ``max_tokens`` exceeds the model's context (or the KV budget could
    never hold it, even alone): 400. Carries the numbers so the message can be precise."""

    status = 400

    def __init__(self, message: str, *, prompt_tokens: int, max_tokens: int, context: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context = context


class Overloaded(GenerationError, errors.Overloaded):
    """The request does not fit the KV budget now and the waiting queue is full (or the
    engine is stopping): 429 with ``retry_after_s``. Nothing was run."""

    status = 429


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples and when it ends. Validated on construction: a bad value
    raises :class:`BadSampling` naming the field.

    ``temperature`` 0 means greedy (``top_k``, ``top_p`` and ``seed`` are then moot);
    ``top_k`` 0 means no top-k cut; ``seed`` None draws a fresh seed. The same seed gives the
    same tokens whatever else runs in the batch, since each request owns its random generator."""

    max_tokens: int = 16
    """Most tokens to generate; the stream ends with ``finish_reason="length"`` there."""
    temperature: float = 1.0
    """Softmax temperature, ≥ 0; 0 is greedy decoding."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``, in (0, 1]."""
    seed: int | None = None
    """Seed of this request's random generator (same seed, same tokens)."""
    repetition_penalty: float = 1.0
    """> 0; logits of tokens already in the prompt or output are divided (if positive) or
    multiplied (if negative) by it, as in Hugging Face's ``RepetitionPenaltyLogitsProcessor``."""
    stop: tuple[str, ...] = field(default_factory=tuple)
    """Strings that end the stream; the text is cut before the stop string, which is never emitted."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (benchmarks)."""
    resume_offset: int = 0
    """The last ``resume_offset`` prompt tokens are this completion's output so far: a stream
    another node started, continued here (central's gateway after a node died). Only the
    prompt before them is prefilled; they are replayed one decode step each, as the first node
    fed them (a prefill's numbers differ slightly, enough to change a low-precision model's
    later tokens). The random generator skips the draws those tokens took and their text counts
    as already sent, so a greedy or seeded stream goes on exactly as the first node would have."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # a single string is a common client shape
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("top_k", self.top_k, low=0)
        _check_int("resume_offset", self.resume_offset, low=0)
        _check_float("temperature", self.temperature, lambda v: v >= 0, "must be ≥ 0")
        _check_float("top_p", self.top_p, lambda v: 0 < v <= 1, "must be in (0, 1]")
        _check_float("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "must be > 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise BadSampling("seed must be an integer", field="seed")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise BadSampling("seed must be in [0, 2**63)", field="seed")
        _check_stop(self.stop)

    @property
    def greedy(self) -> bool:
        """True when decoding takes the most likely token every step."""
        return self.temperature == 0

    @property
    def reproducible(self) -> bool:
        """True when the tokens are a function of the prompt alone (greedy, or sampled with a
        seed): what another node must be able to continue exactly."""
        return self.greedy or self.seed is not None


def _check_int(name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadSampling(f"{name} must be an integer, got {value!r}", field=name)
    if value < low:
        raise BadSampling(f"{name} must be ≥ {low}, got {value}", field=name)


def _check_float(name: str, value: object, ok: object, rule: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadSampling(f"{name} must be a finite number, got {value!r}", field=name)
    if not ok(value):  # type: ignore[operator]
        raise BadSampling(f"{name} {rule}, got {value}", field=name)


def _check_stop(stop: tuple[str, ...]) -> None:
    if len(stop) > MAX_STOP_STRINGS:
        raise BadSampling(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", field="stop")
    for s in stop:
        if not isinstance(s, str) or not s:
            raise BadSampling("each stop string must be a non-empty string", field="stop")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise BadSampling(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters", field="stop")


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One step of a stream: the tokens this step added and the text they completed.

    ``text`` never ends inside a UTF-8 character nor inside a possible stop string: text
    held back for that comes in a later step (or is dropped if it turns into the stop
    string). The last StepOutput of a stream has ``finish_reason`` set; when that is EOS, its
    token is in ``token_ids`` (and counted) but adds no text; when it is a stop string, ``text``
    ends before it."""

    token_ids: tuple[int, ...]
    """Token ids generated this step (one per step today; a tuple so speculative steps can add several)."""
    text: str
    """Text delta to append; concatenating every step's ``text`` gives the whole completion."""
    finish_reason: FinishReason | None
    """None while running; ``"stop"`` (EOS or a stop string) or ``"length"`` (max_tokens, context) at the end."""
    prompt_tokens: int
    """Tokens of the prompt (for ``usage``)."""
    completion_tokens: int
    """Tokens generated so far, this step included (for ``usage``)."""
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (not prefilled again)."""
    queued_s: float = 0.0
    """On a stream's first step: seconds it waited for a batch row and KV room (vLLM's queue time); 0 after."""
    prefill_s: float = 0.0
    """On a stream's first step: seconds from its admission to its first token (vLLM's prefill time: its
    own prompt chunks, and the other prompts' chunks and decode steps run between them); 0 after."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's counters (gauges now, totals since start), for metrics and heartbeats."""

    running: int
    """Sequences in the running batch (prefilling or decoding)."""
    waiting: int
    """Requests queued for KV room or a batch slot."""
    kv_blocks_used: int
    """KV blocks taken (running sequences' reservations plus cached prefix blocks)."""
    kv_blocks_total: int
    """KV blocks the budget allows."""
    prefix_queries: int
    """Prompt blocks looked up in the prefix cache (total)."""
    prefix_hits: int
    """Of those, blocks found (total); hits / queries is the prefix cache hit rate."""
    prompt_tokens: int
    """Prompt tokens of admitted requests (total)."""
    generation_tokens: int
    """Tokens generated (total)."""
    prefilled_tokens: int = 0
    """Prompt tokens actually run through the model (total; prompt_tokens minus cache hits)."""
    prefill_seconds: float = 0.0
    """Seconds the engine thread spent in prefill runs (total)."""
    decode_seconds: float = 0.0
    """Seconds the engine thread spent in decode steps (total)."""
    warmed_tokens: int = 0
    """Tokens run to cache chat turns ahead of their next prompt (total; not prompt tokens)."""
    warm_seconds: float = 0.0
    """Seconds the engine thread spent in those runs (total)."""

    @property
    def kv_usage(self) -> float:
        """Share of the KV budget in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
