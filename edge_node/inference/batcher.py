"""Dynamic batching: concurrent requests for one model run as one session call.

Small requests are what an edge mostly sees, and one ``session.run`` over 32 rows
costs little more than over one. Requests wait at most ``max_queue_delay_s`` for others
to join (up to ``max_batch_size`` rows), then their inputs are concatenated along the
first (batch) axis, run in a worker thread (never on the event loop), and the outputs
are split back by rows, in order. Only requests whose every input has the same dtype
and non-batch shape can share a batch, so the queue groups them by that signature.
A request larger than ``max_batch_size`` is split into max-size pieces and re-merged,
which also keeps fixed-profile accelerators (TensorRT) within their maximum batch;
with ``split_oversized=False`` it runs alone, whole."""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from edge_node.errors import InferenceFailed, InvalidInputs, ModelUnavailable, QueueFull
from edge_node.inference.metrics import ModelMetrics, Outcome
from edge_node.inference.run_errors import explain_run_error

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
RunFn = Callable[[Tensors], Tensors]
#: Per input, sorted by name: (name, dtype, shape without the batch axis).
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(eq=False)
class _Pending:
    """One queued piece of a request (a whole request unless it was split)."""

    inputs: Tensors
    rows: int
    signature: Signature
    future: asyncio.Future[Tensors]
    enqueued: float
    queued: bool = True


def signature_of(inputs: Tensors) -> tuple[int, Signature]:
    """``(rows, signature)`` of a request whose inputs share one non-empty batch axis (what
    ``edge_node.inference.inputs.check_inputs`` made sure of before the request came here)."""
    count = next(iter(inputs.values())).shape[0]
    sig = tuple(sorted((name, a.dtype.str, tuple(a.shape[1:])) for name, a in inputs.items()))
    return int(count), sig


def _pieces(inputs: Tensors, rows: int, size: int) -> list[tuple[Tensors, int]]:
    """``inputs`` cut into pieces of at most ``size`` rows (views, no copies)."""
    if rows <= size:
        return [(inputs, rows)]
    return [({k: a[i : i + size] for k, a in inputs.items()}, min(size, rows - i)) for i in range(0, rows, size)]


def _concat(parts: list[Tensors]) -> Tensors:
    """Row-wise concatenation of same-keyed tensor dicts (no copy for a single part)."""
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class DynamicBatcher:
    """Queue, batch and run the requests of one model version.

    Must be used from one event loop. ``max_batch_size=1, max_queue_delay_s=0`` with
    ``split_oversized=False`` turns batching off: each request runs alone and whole,
    still off the loop and still bounded."""

    def __init__(
        self,
        run: RunFn,
        *,
        max_batch_size: int = 32,
        max_queue_delay_s: float = 0.005,
        max_queue_rows: int = 1024,
        max_concurrent_batches: int = 1,
        executor: Executor | None = None,
        metrics: ModelMetrics | None = None,
        split_oversized: bool = True,
        name: str = "model",
        explain: Callable[[Exception, Tensors], Exception] = explain_run_error,
    ) -> None:
        if max_batch_size < 1 or max_queue_rows < 1 or max_concurrent_batches < 1 or max_queue_delay_s < 0:
            raise ValueError("batch size, queue rows and concurrency must be >= 1 and the delay >= 0")
        self._run = run
        #: Turns what ``run`` raised for a request's inputs into the error its caller gets.
        self._explain = explain
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.max_queue_rows = max_queue_rows
        self.max_concurrent_batches = max_concurrent_batches
        self.split_oversized = split_oversized
        self.name = name
        # Without metrics, count into a private registry: no "if metrics" on the hot path.
        self._metrics = metrics or ModelMetrics(CollectorRegistry(), name, "")
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_concurrent_batches, thread_name_prefix=f"batch-{name}")
        self._heap: list[tuple[int, int, _Pending]] = []
        self._seq = itertools.count()
        self._rows_waiting = 0
        self._rows_by_sig: collections.Counter[Signature] = collections.Counter()
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(max_concurrent_batches)
        self._inflight: set[asyncio.Task[None]] = set()
        self._dispatcher: asyncio.Task[None] | None = None
        self._closing = False
        self._batch_s = 0.01  # moving average of one batch's run time, for Retry-After

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a batch (not yet running)."""
        return self._rows_waiting

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called; submits are refused from then on."""
        return self._closing

    async def submit(self, inputs: Tensors, priority: int = 0) -> Tensors:
        """Run ``inputs`` (first axis = rows) in a batch and return this request's rows.

        Higher ``priority`` is taken first, FIFO within a priority. Raises QueueFull at
        once when the queue is full, ModelUnavailable after ``close``, and whatever ``run`` raised for the batch.
        ``inputs`` were checked (``edge_node.inference.inputs``): one non-empty batch axis."""
        if self._closing:
            self._metrics.request("unavailable")
            raise ModelUnavailable(f"{self.name} is closed")
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        rows, sig = signature_of(arrays)
        self._admit(rows)
        pieces = self._enqueue(arrays, rows, sig, priority)
        try:
            result = _concat([await p.future for p in pieces])
        except BaseException as exc:
            # Cancelled (or failed) while pieces still wait: they give their rows back here,
            # once, rather than through a done-callback every completed request would pay.
            for p in pieces:
                p.future.cancel()
                if p.queued:
                    self._unqueue(p)
            self._metrics.queue_depth(self._rows_waiting)
            self._metrics.request(_outcome(exc))
            raise
        self._metrics.request("ok")
        return result

    async def close(self) -> None:
        """Refuse new requests, run everything already queued, wait for running batches."""
        self._closing = True
        self._arrived.set()
        if self._dispatcher is not None:
            await self._dispatcher
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._own_executor:
            self._executor.shutdown(wait=False)

    # -- queue ---------------------------------------------------------------------------

    def _admit(self, rows: int) -> None:
        """Raise QueueFull unless ``rows`` fit (an empty queue admits any request)."""
        if self._rows_waiting and self._rows_waiting + rows > self.max_queue_rows:
            retry = self._retry_after()
            self._metrics.request("queue_full")
            raise QueueFull(
                f"the queue of {self.name} holds {self._rows_waiting} rows (limit {self.max_queue_rows}); "
                f"retry in {retry:.3f}s",
                retry_after_s=retry,
            )

    def _retry_after(self) -> float:
        """Roughly how long until the queued rows have run."""
        batches = math.ceil(self._rows_waiting / self.max_batch_size) / self.max_concurrent_batches
        return max(self.max_queue_delay_s, batches * self._batch_s, 0.001)

    def _enqueue(self, inputs: Tensors, rows: int, sig: Signature, priority: int) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        if self._dispatcher is None:
            self._dispatcher = loop.create_task(self._dispatch(), name=f"batcher-{self.name}")
        now, pieces = time.monotonic(), []
        size = self.max_batch_size if self.split_oversized else max(rows, self.max_batch_size)
        for piece, n in _pieces(inputs, rows, size):
            pending = _Pending(piece, n, sig, loop.create_future(), now)
            heapq.heappush(self._heap, (-priority, next(self._seq), pending))
            self._rows_waiting += n
            self._rows_by_sig[sig] += n
            pieces.append(pending)
        self._metrics.queue_depth(self._rows_waiting)
        self._arrived.set()
        return pieces

    def _unqueue(self, pending: _Pending) -> None:
        """Give back the rows of a piece leaving the queue (taken, or its caller gone); the
        queue-depth gauge is the caller's to update, once for all it removed."""
        pending.queued = False
        self._rows_waiting -= pending.rows
        self._rows_by_sig[pending.signature] -= pending.rows
        if self._rows_by_sig[pending.signature] <= 0:
            del self._rows_by_sig[pending.signature]

    def _head(self) -> _Pending | None:
        """The live piece to serve next, dropping cancelled ones from the top (their rows
        were given back by their callers)."""
        while self._heap and self._heap[0][2].future.done():
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    # -- dispatch ------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        """Run the batching loop; should it ever fail, fail the queued callers too
        rather than leave them waiting forever."""
        try:
            await self._dispatch_loop()
        except Exception as exc:
            log.exception("batcher %s stopped", self.name)
            self._closing = True
            for _, _, pending in self._heap:
                if not pending.future.done():
                    pending.future.set_exception(ModelUnavailable(f"{self.name} failed: {exc}"))
            self._heap.clear()

    async def _dispatch_loop(self) -> None:
        """Form batches until closed and empty; one free slot per batch started."""
        while True:
            if self._head() is None:
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._slots.acquire()
            batch = await self._collect()
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _collect(self) -> list[_Pending]:
        """Wait (at most the head's delay) for a full batch, then take it."""
        head = self._head()
        if head is None:
            return []
        deadline = head.enqueued + self.max_queue_delay_s
        while not self._closing and self._rows_by_sig[head.signature] < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                break
            head = self._head()
            if head is None:
                return []
            deadline = min(deadline, head.enqueued + self.max_queue_delay_s)
        return self._take(head.signature)

    def _take(self, sig: Signature) -> list[_Pending]:
        """Remove and return, in priority order, the pieces of ``sig`` that fit one batch
        (the first always goes, even if it alone exceeds the batch size: unsplit). Pops
        only until the batch is full, so a batch costs its own pieces, not the queue's."""
        now, rows = time.monotonic(), 0
        taken: list[_Pending] = []
        skipped: list[tuple[int, int, _Pending]] = []
        heap = self._heap
        while heap and rows < self.max_batch_size:
            item = heapq.heappop(heap)
            pending = item[2]
            if pending.future.done():
                continue
            if pending.signature == sig and (not taken or rows + pending.rows <= self.max_batch_size):
                taken.append(pending)
                rows += pending.rows
                self._unqueue(pending)
                self._metrics.queued(now - pending.enqueued)
            else:
                skipped.append(item)
        for item in skipped:
            heapq.heappush(heap, item)
        self._metrics.queue_depth(self._rows_waiting)
        return taken

    async def _execute(self, batch: list[_Pending]) -> None:
        """Run one batch in the executor and hand each caller its rows (or the error).
        A batch of several that fails is run again one piece at a time, so a request
        whose data the model refuses fails alone; the others get their rows."""
        try:
            if all(p.future.done() for p in batch):
                return  # every caller gave up while it waited for a slot
            rows = sum(p.rows for p in batch)
            try:
                outputs = await self._timed_run(_concat([p.inputs for p in batch]), rows)
            except Exception as exc:
                if len(batch) == 1:
                    _fail(batch[0], self._explain(exc, batch[0].inputs))
                    return
                log.info("batch of %d requests to %s failed (%s); running them one by one", len(batch), self.name, exc)
                await self._one_by_one(batch)
                return
            _deliver(batch, outputs, rows)
        except Exception as exc:
            for p in batch:
                _fail(p, exc)
        finally:
            self._slots.release()

    async def _one_by_one(self, batch: list[_Pending]) -> None:
        """Run each still-waiting piece of a failed batch alone; each gets its own outcome."""
        for p in batch:
            if p.future.done():
                continue
            try:
                outputs = await self._timed_run(p.inputs, p.rows)
            except Exception as exc:
                _fail(p, self._explain(exc, p.inputs))
            else:
                _deliver([p], outputs, p.rows)

    async def _timed_run(self, inputs: Tensors, rows: int) -> Tensors:
        start = time.perf_counter()
        outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run, inputs)
        self._observe(rows, time.perf_counter() - start)
        return outputs

    def _observe(self, rows: int, seconds: float) -> None:
        self._batch_s = 0.8 * self._batch_s + 0.2 * seconds
        self._metrics.batch(rows, seconds)


def _outcome(exc: BaseException) -> Outcome:
    """The metrics outcome of a request that raised ``exc``: a bad request is not a model error."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "invalid" if isinstance(exc, InvalidInputs) else "error"


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)


def _deliver(batch: list[_Pending], outputs: Tensors, rows: int) -> None:
    """Split ``outputs`` by rows, in batch order; callers that left are skipped."""
    if len(batch) == 1:
        if not batch[0].future.done():
            batch[0].future.set_result(outputs)
        return
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise InferenceFailed(f"output {name!r} has shape {list(array.shape)}: no batch axis of {rows} rows")
    start = 0
    for p in batch:
        if not p.future.done():
            p.future.set_result({k: v[start : start + p.rows] for k, v in outputs.items()})
        start += p.rows
