"""The engine thread: takes requests from a thread-safe inbox, admits them within the KV
budget, and alternates prefill chunks with decode steps of the whole running batch.

Every iteration first applies what arrived (new requests, cancellations), then runs one
prefill of at most ``prefill_chunk_tokens`` (padding included) for the prompts admitted,
several prompts' chunks together in one session run — or, with no prompt admitted or
waiting, one finished chat turn warmed for the next (``warm``) — then one decode step for
every decoding row. A long prompt thus costs the running streams one chunk per step, never a
stall for the whole prompt. A resumed stream's tokens already sent are fed by decode steps in
place of sampled ones (``Sequence.forced``) before it samples its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from edge_node import errors
from edge_node.generation.batch import RunningBatch
from edge_node.generation.model import usable_cores
from edge_node.generation.sequence import Delivery, Sequence
from edge_node.generation.settings import EngineSettings
from edge_node.generation.types import Overloaded

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)

_STOP = object()


class Scheduler:
    """Owns the running batch and the waiting queue; runs on its own thread."""

    def __init__(self, batch: RunningBatch, settings: EngineSettings, eos: tuple[int, ...]) -> None:
        self.batch = batch
        self.settings = settings
        self.eos = eos
        self.waiting: deque[Sequence] = deque()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefill_seconds = 0.0
        """Seconds spent in prefill runs (total)."""
        self.decode_seconds = 0.0
        """Seconds spent in decode steps (total)."""
        self.warmed_tokens = 0
        """Tokens run to warm turns ahead of their prompts (total; not in the prompt counters)."""
        self.warm_seconds = 0.0
        """Seconds spent warming (total; the lookups of warms that found nothing to run included)."""
        self.warming: deque[list[int]] = deque(maxlen=max(1, settings.max_waiting))
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._outbox: list[tuple[Sequence, Delivery]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatch: Callable[[list[tuple[Sequence, Delivery]]], None] | None = None
        self._thread: threading.Thread | None = None

    def start(
        self, loop: asyncio.AbstractEventLoop, dispatch: Callable[[list[tuple[Sequence, Delivery]]], None]
    ) -> None:
        """Start the thread; ``dispatch`` runs on ``loop`` with each step's deliveries."""
        self._loop, self._dispatch = loop, dispatch
        self._thread = threading.Thread(target=self._run, name="generation-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end every sequence and exit; blocks until it has."""
        if self._thread is None:
            return
        self._inbox.put(_STOP)
        self._thread.join()
        self._thread = None

    def submit(self, seq: Sequence) -> None:
        """Hand a new request to the engine thread (any thread)."""
        self._inbox.put(seq)

    def cancel(self, seq: Sequence) -> None:
        """Ask the engine thread to drop ``seq`` at its next step (any thread)."""
        seq.cancelled = True
        self._inbox.put(("cancel", seq))

    def warm(self, tokens: list[int]) -> None:
        """Ask the engine thread to cache the KV of ``tokens`` (whole blocks and the part block
        they end with) when it has no prompt to run and a free row (any thread); the oldest such
        request is dropped once ``max_waiting`` are queued."""
        self._inbox.put(("warm", tokens))

    def deliver(self, seq: Sequence, item: Delivery) -> None:
        """Queue ``item`` for ``seq``'s stream; sent to the event loop at the end of the step."""
        self._outbox.append((seq, item))

    def _run(self) -> None:
        if self.settings.pin_threads and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {usable_cores()[0]})  # this thread only (Linux affinity is per thread)
        try:
            while self._take_inbox(block=self._idle()):
                try:
                    self._iterate()
                except Exception as exc:  # a failed run ends the sequences in it, not the engine
                    log.exception("a generation step failed")
                    self._fail_running(errors.InferenceFailed(f"generation failed: {exc}"))
                self._flush()
        except Exception as exc:  # the engine thread must end its streams, never vanish silently
            log.exception("generation engine failed")
            self._end_all(errors.InferenceFailed(f"the generation engine failed: {exc}"))
        else:
            self._end_all(errors.ModelUnavailable("the model is being unloaded"))
        self._flush()

    def _idle(self) -> bool:
        return not self.batch.size and not self.waiting and not self.warming

    def _take_inbox(self, *, block: bool) -> bool:
        """Apply everything in the inbox (waiting for the first item when idle); False on stop."""
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if item is _STOP:
                return False
            if isinstance(item, Sequence):
                self._add(item)
            elif isinstance(item, tuple) and item[0] == "warm":
                self.warming.append(item[1])
            elif isinstance(item, tuple):
                self._drop(item[1])

    def _add(self, seq: Sequence) -> None:
        if seq.cancelled:
            return
        if not self.waiting and self.batch.can_admit() and self.batch.admit(seq):
            self._admitted(seq)
        elif len(self.waiting) < self.settings.max_waiting:
            self.waiting.append(seq)
        else:
            seq.finished = True
            self.deliver(seq, _overloaded(self.settings, "no KV room or batch row, and the waiting queue is full"))

    def _drop(self, seq: Sequence) -> None:
        if seq.finished:
            return
        seq.finished = True
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.slot >= 0:
            self.batch.remove(seq)

    def _iterate(self) -> None:
        budget = self.settings.prefill_chunk_tokens
        self._admit_waiting(budget)
        if self.batch.prefilling:
            started = time.perf_counter()
            done, _ = self.batch.prefill_step(budget, self._first)
            self.prefill_seconds += time.perf_counter() - started
            for seq, _logits in done:
                self.batch.join(seq)
                self._leave_if_ended(seq)
        elif self.warming and not self.waiting and self.batch.can_admit():
            self._warm()
        if self.batch.decoding:
            self._decode()

    def _admit_waiting(self, budget: int) -> None:
        """Admit waiting requests while a row and KV room are free and the prompts admitted
        but not prefilled fall short of one step's ``budget``."""
        while self.waiting and self.batch.can_admit() and self.batch.prompt_backlog < budget:
            if not self.batch.admit(self.waiting[0]):
                return
            self._admitted(self.waiting.popleft())

    def _warm(self) -> None:
        """Warm the newest finished turn queued (the oldest is the likeliest to have had its
        next turn already): a prompt that arrives meanwhile waits for one run of at most
        ``turn_warm_tokens`` and ``prefill_chunk_tokens``, as it would for a prefill chunk. A
        failed warm run is logged and dropped; it never ends a stream."""
        started = time.perf_counter()
        most = min(self.settings.turn_warm_tokens, self.settings.prefill_chunk_tokens)
        try:
            ran = self.batch.warm(self.warming.pop(), most)
        except Exception:  # an optional run: the streams decoding beside it go on
            log.exception("warming a finished chat turn failed")
            if not self.batch.size:
                self.batch.kv.release()
            return
        self.warm_seconds += time.perf_counter() - started
        self.warmed_tokens += ran

    def _admitted(self, seq: Sequence) -> None:
        seq.admitted = time.perf_counter()
        self.prompt_tokens += seq.prompt_tokens

    def _decode(self) -> None:
        started = time.perf_counter()
        logits = self.batch.decode_step()
        self.decode_seconds += time.perf_counter() - started
        for seq, row in zip(list(self.batch.decoding), logits, strict=True):
            self._next(seq, row)

    def _first(self, seq: Sequence, logits: np.ndarray) -> None:
        """A prompt has just run to its end: choose its first token and send it now, not after
        the step's other prompts and decode step (a resumed stream replays its first sent one)."""
        if seq.forced:
            seq.replay()
        else:
            self._accept(seq, seq.sampler.next_token(logits), leave=False)
            self._flush()

    def _next(self, seq: Sequence, logits: np.ndarray) -> None:
        """Choose the token ``seq`` feeds next: a resumed stream's next token sent (replayed,
        ``logits`` unused), else one sampled from ``logits``."""
        if seq.forced:
            seq.replay()
        else:
            self._accept(seq, seq.sampler.next_token(logits))

    def _accept(self, seq: Sequence, token: int, *, leave: bool = True) -> None:
        """Record ``token``; an ended or cancelled sequence leaves the batch now (``leave``) or
        once the prefill step it finished in is over."""
        self.generation_tokens += 1
        seq.accept(token, self.eos)
        if leave:
            self._leave_if_ended(seq)

    def _leave_if_ended(self, seq: Sequence) -> None:
        """An ended or cancelled sequence leaves the batch (its row and reservation freed)."""
        if seq.finished or seq.cancelled:
            seq.finished = True
            self.batch.remove(seq)

    def _fail_running(self, error: BaseException) -> None:
        for seq in self.batch.running:
            if not seq.finished:
                seq.finished = True
                self.deliver(seq, error)
            self.batch.remove(seq, keep_prefix=False)

    def _end_all(self, error: BaseException) -> None:
        self._fail_running(error)
        for seq in self.waiting:
            seq.finished = True
            self.deliver(seq, error)
        self.waiting.clear()
        while True:  # requests that arrived after the stop
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Sequence):
                self.deliver(item, error)

    def _flush(self) -> None:
        if self._outbox and self._loop is not None and self._dispatch is not None:
            batch, self._outbox = self._outbox, []
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
                self._loop.call_soon_threadsafe(self._dispatch, batch)


def _overloaded(settings: EngineSettings, why: str) -> Overloaded:
    return Overloaded(f"the model is at capacity ({why}); retry later", retry_after_s=settings.retry_after_s)
