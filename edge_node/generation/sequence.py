"""One request inside the engine: its tokens, where its KV is, its sampling and text state."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_node.generation.detok import TextStream
from edge_node.generation.sampling import TokenSampler
from edge_node.generation.types import FinishReason, SamplingParams, StepOutput

__all__ = ["Sequence"]

#: What the engine thread hands back to a stream: a step, or the error that ends it.
Delivery = StepOutput | BaseException


@dataclass(eq=False, slots=True)
class Sequence:
    """A request from submission to its last step; touched by the engine thread only,
    except ``cancelled``, which the event loop sets."""

    request_id: str
    prompt: list[int]
    """The tokens to prefill: the request's prompt, less a resumed stream's tokens sent (``forced``)."""
    params: SamplingParams
    sampler: TokenSampler
    text: TextStream
    deliver: Callable[[Sequence, Delivery], None]
    """Queues a delivery for the stream (called on the engine thread, flushed once per step)."""
    limit: int
    """Most tokens (prompt + output) this sequence may reach: prompt + max_tokens, capped by the context."""
    forced: deque[int] = field(default_factory=deque)
    """A resumed stream's tokens already sent (by the node that began it), still to replay: each
    is fed at the next decode step in place of a sampled token and emits nothing, so their KV
    is computed one decode step at a time, as the first node computed it (a prefill of them
    differs slightly in low precision, enough to flip a near-tie later on)."""
    output: list[int] = field(default_factory=list)
    """Tokens fed after the prompt: the replayed ones first, then those generated here."""
    length: int = 0
    """Tokens whose KV is in the batch buffer."""
    cached: int = 0
    """Prompt tokens whose KV came from the prefix cache."""
    arrived: float = 0.0
    """``time.perf_counter()`` when the request reached the engine."""
    admitted: float = 0.0
    """``time.perf_counter()`` when it got a batch row (0 while waiting)."""
    slot: int = -1
    """Row of the batch buffer, -1 while waiting."""
    reserved_blocks: int = 0
    cancelled: bool = False
    finished: bool = False

    @property
    def prompt_tokens(self) -> int:
        """The request's prompt tokens, a resumed stream's tokens sent included."""
        return len(self.prompt) + self.params.resume_offset

    @property
    def pending(self) -> int:
        """The last token of ``output`` (generated or replayed), to be fed at the next decode step."""
        return self.output[-1]

    @property
    def tokens(self) -> list[int]:
        """Prompt and output."""
        return self.prompt + self.output

    def replay(self) -> None:
        """Take the next forced token as the one fed at the next decode step."""
        self.output.append(self.forced.popleft())

    def accept(self, token: int, eos: tuple[int, ...]) -> None:
        """Record ``token`` and hand its step to the stream (with the finish reason if it ends here)."""
        self.output.append(token)
        completion = len(self.output) - self.params.resume_offset
        reason: FinishReason | None = None
        if token in eos and not self.params.ignore_eos:
            reason, text = "stop", ""
        else:
            text = self.text.add(token)
            if self.text.stopped:
                reason = "stop"
            elif completion >= self.params.max_tokens or len(self.prompt) + len(self.output) >= self.limit:
                reason = "length"
        if reason is not None:
            text += self.text.flush()
            self.finished = True
        queued = prefill = 0.0
        if completion == 1:  # the stream's first token: where its time to it went
            queued, prefill = self.admitted - self.arrived, time.perf_counter() - self.admitted
        self.deliver(
            self,
            StepOutput(
                token_ids=(token,),
                text=text,
                finish_reason=reason,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=completion,
                cached_tokens=self.cached,
                queued_s=queued,
                prefill_s=prefill,
            ),
        )
