"""The generation engine: one language model, continuously batched, streamed to asyncio callers.

(Interface first; the scheduler behind it lands in the following commits.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from edge_node.generation.settings import EngineSettings
from edge_node.generation.tokenizer import Tokenizer
from edge_node.generation.types import EngineStats, SamplingParams, StepOutput

__all__ = ["GenerationEngine"]


class GenerationEngine:
    """Serves one decoder model (the ONNX Runtime GenAI layout) to many concurrent streams.

    ``load`` (blocking: run it in a worker thread) reads the folder; ``start`` starts the
    engine thread that runs ONNX Runtime; ``generate`` streams one request's tokens;
    ``stop`` ends every stream and the thread. All ONNX Runtime work happens on the engine
    thread, never on the event loop."""

    tokenizer: Tokenizer
    """The model's tokenizer and chat template."""
    context_length: int
    """Most tokens (prompt + generated) one sequence may have."""

    @classmethod
    def load(cls, folder: Path, settings: EngineSettings) -> GenerationEngine:
        """Load ``genai_config.json``, the tokenizer, the chat template and the ONNX session
        from ``folder``. Blocking; raises ``ValueError`` naming the file when the folder is unusable."""
        raise NotImplementedError

    async def start(self) -> None:
        """Start the engine thread; ``generate`` works from now until ``stop``."""
        raise NotImplementedError

    async def stop(self) -> None:
        """End every stream (waiting ones get :class:`Overloaded`, running ones end) and join the thread."""
        raise NotImplementedError

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise :class:`BadSampling` (empty prompt, a token id outside the vocabulary) or
        :class:`ContextTooLong` now, without queueing anything; ``generate`` checks the same."""
        raise NotImplementedError

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str) -> AsyncIterator[StepOutput]:
        """Stream the completion of ``prompt_ids``: one :class:`StepOutput` per decode step,
        the last with ``finish_reason`` set.

        Errors come from the first ``__anext__``, before any output: :class:`BadSampling`,
        :class:`ContextTooLong`, :class:`Overloaded` (429: no KV room and the waiting queue
        full). A transport that awaits the first item before sending its status line can
        therefore still answer them as HTTP errors. Closing the iterator (``aclose``) or
        cancelling the task that iterates frees the sequence's slot and KV at the next step."""
        raise NotImplementedError

    def stats(self) -> EngineStats:
        """A snapshot of the counters (running, waiting, KV blocks, prefix cache, tokens)."""
        raise NotImplementedError
