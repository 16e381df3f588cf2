"""The generation engine's settings (one pydantic model, a section of the edge's settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["EngineSettings"]


class EngineSettings(BaseModel):
    """How one language model is served: batch size, KV budget, prefix cache, prefill chunks, threads.

    The KV budget is the most KV (in tokens, bytes, or the smaller of both) that running
    sequences may reserve plus what the prefix cache keeps; a request reserves its prompt
    plus ``max_tokens`` when it is admitted, so a running sequence never runs out of room."""

    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(16, ge=1, le=256)
    """Most sequences in the running batch (decoded together each step)."""
    kv_budget_tokens: int | None = Field(None, ge=1)
    """KV budget in tokens (all layers); None: only ``kv_budget_bytes`` bounds it."""
    kv_budget_bytes: int | None = Field(1 << 30, ge=1)
    """KV budget in bytes; None: only ``kv_budget_tokens`` bounds it."""
    block_tokens: int = Field(32, ge=1, le=4096)
    """Tokens per KV block: the unit of reservations and of the prefix cache."""
    prefix_cache: bool = True
    """Keep the KV of prompt prefixes (whole blocks) for later prompts that start the same way."""
    prefill_chunk_tokens: int = Field(256, ge=1)
    """Most prompt tokens prefilled in one step; longer prompts are prefilled in chunks
    between decode steps so the running streams keep flowing."""
    turn_warm_tokens: int = Field(128, ge=0)
    """After a chat completion, the conversation as its next turn will begin (the reply
    rendered from its text, as the client sends it back, and the template's end of turn) is
    prefilled into the prefix cache when the engine has no prompt to run and at most this many
    of its tokens (and at most ``prefill_chunk_tokens``) are missing there: a reply's text does
    not always encode back to the token ids generated, so without it the next turn recomputes
    the reply from where they part. 0: off."""
    batch_invariant: Literal["auto", "on", "off"] = "auto"
    """Run a lone greedy or seeded decoding row beside a scratch row, so such a stream's
    numbers never depend on whether it decoded alone (an unseeded sampled one is never
    reproduced): on some CPUs ONNX Runtime's one-row MatMul rounds differently from its
    many-row one (an AVX2 CPU without AVX-512, measured), and a greedy or seeded stream
    resumed on another node would then not continue exactly. ``auto``: probe at load and pad
    only where the two differ (that CPU: a lone 4-bit stream of the 200m model decoded at
    0.81x its unpadded speed; nothing changes once two streams decode). ``on``: always;
    ``off``: never. A batch of one row (``max_batch`` 1) is never padded."""
    max_waiting: int = Field(64, ge=0)
    """Requests that may wait for KV room or a batch slot; beyond that a request gets 429."""
    retry_after_s: float = Field(1.0, gt=0)
    """The Retry-After hint of a 429 when the queue is full."""
    max_context: int | None = Field(None, ge=2)
    """Cap on prompt + max_tokens below the model's own context length (None: the model's)."""
    intra_op_threads: int = Field(0, ge=0)
    """ONNX Runtime intra-op threads (0: one per core)."""
    pin_threads: bool = False
    """Pin the engine thread (ONNX Runtime's intra-op thread 0) to the first core and each
    further intra-op thread to a core of its own (``session.intra_op_thread_affinities``); the
    event loop's thread moves to the cores left over, if any."""
    spinning: bool = False
    """Let idle intra-op threads spin for work (``session.intra_op.allow_spinning``); off, they
    sleep, which leaves the cores to the event loop that writes the streams between steps. Off
    by default: over HTTP on 2 cores, spinning workers starved the event loop (single-stream
    24.8 tokens/s against 123 without spinning, ``bench.generate``); in process alone it gains
    a little (docs/generation.md)."""

    @model_validator(mode="after")
    def _a_budget(self) -> EngineSettings:
        if self.kv_budget_tokens is None and self.kv_budget_bytes is None:
            raise ValueError("set kv_budget_tokens or kv_budget_bytes (or both)")
        return self

    def budget_tokens(self, bytes_per_token: int) -> int:
        """The KV budget in tokens for a model whose KV takes ``bytes_per_token`` per token."""
        limits = [self.kv_budget_tokens] if self.kv_budget_tokens is not None else []
        if self.kv_budget_bytes is not None:
            limits.append(self.kv_budget_bytes // max(1, bytes_per_token))
        return min(limits)
