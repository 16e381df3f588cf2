"""The generation engine: one language model, continuously batched, streamed to asyncio callers.

ONNX Runtime runs on the engine thread (:mod:`edge_node.generation.scheduler`); requests
reach it through a thread-safe inbox and their steps come back to the event loop with one
``call_soon_threadsafe`` per step, which puts each step on its stream's ``asyncio.Queue``."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from edge_node import errors
from edge_node.generation.batch import RunningBatch, lone_row_rounds_apart
from edge_node.generation.detok import TextStream
from edge_node.generation.kv import BlockBudget
from edge_node.generation.model import DecoderRunner, DecoderSpec, spare_cores
from edge_node.generation.prefix_cache import PrefixCache
from edge_node.generation.runners import open_runner
from edge_node.generation.sampling import TokenSampler
from edge_node.generation.scheduler import Scheduler
from edge_node.generation.sequence import Delivery
from edge_node.generation.sequence import Sequence as _Sequence
from edge_node.generation.settings import EngineSettings
from edge_node.generation.tokenizer import Tokenizer
from edge_node.generation.types import BadSampling, ContextTooLong, EngineStats, SamplingParams, StepOutput

__all__ = ["GenerationEngine"]

_log = logging.getLogger(__name__)


class GenerationEngine:
    """Serves one decoder model (the ONNX Runtime GenAI layout) to many concurrent streams.

    ``load`` (blocking: run it in a worker thread) reads the folder; ``start`` starts the
    engine thread that runs ONNX Runtime; ``generate`` streams one request's tokens;
    ``stop`` ends every stream and the thread. All ONNX Runtime work happens on the engine
    thread, never on the event loop."""

    def __init__(
        self, spec: DecoderSpec, runner: DecoderRunner, tokenizer: Tokenizer, settings: EngineSettings
    ) -> None:
        self.spec = spec
        """The decoder's shape (layers, heads, context, EOS ids)."""
        self.tokenizer = tokenizer
        """The model's tokenizer and chat template."""
        self.settings = settings
        self.context_length = min(spec.context_length, settings.max_context or spec.context_length)
        """Most tokens (prompt + generated) one sequence may have."""
        total = settings.budget_tokens(runner.bytes_per_token) // settings.block_tokens
        self._budget = BlockBudget(total, settings.block_tokens)
        self._cache = PrefixCache(settings.block_tokens) if settings.prefix_cache else None
        mode = settings.batch_invariant  # one row never shares a batch: nothing to pad, nothing to probe
        pad = settings.max_batch > 1 and (mode == "on" or (mode == "auto" and _rounds_apart(runner, settings)))
        self._batch = RunningBatch(runner, settings.max_batch, self._budget, self._cache, pad_lone_row=pad)
        self._scheduler = Scheduler(self._batch, settings, spec.eos_token_ids)
        self._queues: dict[_Sequence, asyncio.Queue[Delivery]] = {}
        self._started = False
        self._loop_cores: set[int] = set()

    @classmethod
    def load(cls, folder: Path, settings: EngineSettings) -> GenerationEngine:
        """Load ``genai_config.json``, the tokenizer, the chat template and the ONNX session
        from ``folder``. Blocking; raises ``ValueError`` (``ModelLoadError``,
        ``TokenizerLoadError``) naming the file when the folder is unusable."""
        spec = DecoderSpec.from_folder(folder)
        tokenizer = Tokenizer.from_folder(folder)
        runner = open_runner(folder, spec, settings)
        return cls(spec, runner, tokenizer, settings)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one token takes (all layers, keys and values)."""
        return self._batch.runner.bytes_per_token

    async def start(self) -> None:
        """Start the engine thread; ``generate`` works from now until ``stop``."""
        if not self._started:
            if self.settings.pin_threads:
                self._keep_loop_off_pinned_cores()
            self._scheduler.start(asyncio.get_running_loop(), self._dispatch)
            self._started = True

    def _keep_loop_off_pinned_cores(self) -> None:
        """Move the event loop's thread (this one) to the cores the pinned intra-op threads
        leave free, so that neither preempts the other (``stop`` moves it back); with none
        free it stays where it is."""
        spare = spare_cores(self.settings.intra_op_threads)
        if spare and hasattr(os, "sched_setaffinity"):
            self._loop_cores = os.sched_getaffinity(0)
            os.sched_setaffinity(0, spare)

    async def stop(self) -> None:
        """End every stream (each gets ``ModelUnavailable``, 503) and join the engine thread."""
        if self._started:
            self._started = False
            await asyncio.to_thread(self._scheduler.stop)
            if self._loop_cores:
                os.sched_setaffinity(0, self._loop_cores)
                self._loop_cores = set()
            await asyncio.sleep(0)  # let the last dispatch run

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise :class:`BadSampling` (empty prompt, a token id outside the vocabulary) or
        :class:`ContextTooLong` now, without queueing anything; ``generate`` checks the same."""
        if not prompt_ids:
            raise BadSampling("the prompt is empty", field="prompt")
        if params.resume_offset >= len(prompt_ids):
            raise BadSampling("resume_offset must be below the prompt's token count", field="resume_offset")
        vocab = self.spec.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise BadSampling(f"prompt token ids must be in [0, {vocab})", field="prompt")
        need = len(prompt_ids) + params.max_tokens
        if need > self.context_length:
            raise ContextTooLong(
                f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"model's context of {self.context_length} tokens",
                prompt_tokens=len(prompt_ids),
                max_tokens=params.max_tokens,
                context=self.context_length,
            )
        if self._budget.blocks_for(need) > self._budget.total:
            raise ContextTooLong(
                f"the prompt plus max_tokens ({need} tokens) exceeds this node's KV budget "
                f"of {self._budget.total * self._budget.block_tokens} tokens",
                prompt_tokens=len(prompt_ids),
                max_tokens=params.max_tokens,
                context=self._budget.total * self._budget.block_tokens,
            )

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[StepOutput]:
        """Stream the completion of ``prompt_ids``: one :class:`StepOutput` per token, the
        last with ``finish_reason`` set.

        Errors come from the first ``__anext__``, before any output: :class:`BadSampling`,
        :class:`ContextTooLong`, :class:`Overloaded` (429: no KV room and the waiting queue
        full), ``ModelUnavailable`` (503: the engine is stopping). A transport that awaits the
        first item before sending its status line can therefore answer them as HTTP errors.
        Closing the iterator (``aclose``) or cancelling the task that iterates frees the
        sequence's slot and KV at the next step."""
        self.check(prompt_ids, params)
        if not self._started:
            raise errors.ModelUnavailable("the generation engine is not running")
        prompt = [int(t) for t in prompt_ids]
        own = len(prompt) - params.resume_offset  # a resumed stream prefills the first node's prompt, replays the rest
        seq = _Sequence(
            request_id=request_id,
            prompt=prompt[:own],
            forced=deque(prompt[own:]),
            params=params,
            sampler=TokenSampler(params, prompt, self.spec.vocab_size),
            text=TextStream(self.tokenizer.decode, params.stop, prompt[own:]),
            deliver=self._scheduler.deliver,
            limit=len(prompt) + params.max_tokens,
            arrived=time.perf_counter(),
        )
        stream: asyncio.Queue[Delivery] = asyncio.Queue()
        self._queues[seq] = stream
        self._scheduler.submit(seq)
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self._queues.pop(seq, None)
            if not seq.finished:
                self._scheduler.cancel(seq)

    @property
    def warms(self) -> bool:
        """Whether ``warm`` does anything: turn warming on, and a prefix cache to warm."""
        return self._cache is not None and self.settings.turn_warm_tokens > 0

    def warm(self, token_ids: Sequence[int]) -> None:
        """Cache the KV of ``token_ids`` (whole blocks and the part block they end with) when
        the engine has nothing else to prefill, ahead of a prompt expected to begin with them: a
        chat's next turn (see
        ``EngineSettings.turn_warm_tokens``). Never waits; ids out of range or beyond the
        context are ignored, as is everything when the setting or the prefix cache is off."""
        ids = [int(t) for t in token_ids]
        vocab = self.spec.vocab_size
        if not (self._started and self.warms) or len(ids) > self.context_length or any(not 0 <= t < vocab for t in ids):
            return
        self._scheduler.warm(ids)

    def _dispatch(self, deliveries: list[tuple[_Sequence, Delivery]]) -> None:
        for seq, item in deliveries:
            stream = self._queues.get(seq)
            if stream is not None:
                stream.put_nowait(item)

    def stats(self) -> EngineStats:
        """A snapshot of the counters (running, waiting, KV blocks, prefix cache, tokens)."""
        batch, cache = self._batch, self._cache
        return EngineStats(
            running=batch.size,
            waiting=len(self._scheduler.waiting),
            kv_blocks_used=batch.used_blocks,
            kv_blocks_total=self._budget.total,
            prefix_queries=cache.queries if cache is not None else 0,
            prefix_hits=cache.hits if cache is not None else 0,
            prompt_tokens=self._scheduler.prompt_tokens,
            generation_tokens=self._scheduler.generation_tokens,
            prefilled_tokens=batch.prefilled_tokens,
            prefill_seconds=self._scheduler.prefill_seconds,
            decode_seconds=self._scheduler.decode_seconds,
            warmed_tokens=self._scheduler.warmed_tokens,
            warm_seconds=self._scheduler.warm_seconds,
        )


def _rounds_apart(runner: DecoderRunner, settings: EngineSettings) -> bool:
    """``lone_row_rounds_apart``, logged; a graph the probe cannot run decodes unpadded (the
    probe is a safeguard, never a reason to refuse a model that serves)."""
    try:
        apart = lone_row_rounds_apart(runner, settings.block_tokens)
    except Exception as exc:
        _log.warning("the one-row decode probe failed (%s): a lone stream decodes alone", exc)
        return False
    if apart:
        _log.info(
            "this CPU rounds a one-row decode apart from a batched one: a lone stream decodes beside a scratch row"
        )
    return apart
