"""One request inside the engine: its tokens, where its KV is, its sampling and text state."""

from __future__ import annotations

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
    params: SamplingParams
    sampler: TokenSampler
    text: TextStream
    deliver: Callable[[Sequence, Delivery], None]
    """Queues a delivery for the stream (called on the engine thread, flushed once per step)."""
    limit: int
    """Most tokens (prompt + output) this sequence may reach: prompt + max_tokens, capped by the context."""
    output: list[int] = field(default_factory=list)
    length: int = 0
    """Tokens whose KV is in the batch buffer."""
    cached: int = 0
    """Prompt tokens whose KV came from the prefix cache."""
    slot: int = -1
    """Row of the batch buffer, -1 while waiting."""
    reserved_blocks: int = 0
    cancelled: bool = False
    finished: bool = False

    @property
    def pending(self) -> int:
        """The last token generated, to be fed at the next decode step."""
        return self.output[-1]

    @property
    def tokens(self) -> list[int]:
        """Prompt and output."""
        return self.prompt + self.output

    def accept(self, token: int, eos: tuple[int, ...]) -> None:
        """Record ``token`` and hand its step to the stream (with the finish reason if it ends here)."""
        self.output.append(token)
        reason: FinishReason | None = None
        if token in eos and not self.params.ignore_eos:
            reason, text = "stop", ""
        else:
            text = self.text.add(token)
            if self.text.stopped:
                reason = "stop"
            elif len(self.output) >= self.params.max_tokens or len(self.prompt) + len(self.output) >= self.limit:
                reason = "length"
        if reason is not None:
            text += self.text.flush()
            self.finished = True
        self.deliver(
            self,
            StepOutput(
                token_ids=(token,),
                text=text,
                finish_reason=reason,
                prompt_tokens=len(self.prompt),
                completion_tokens=len(self.output),
                cached_tokens=self.cached,
            ),
        )
