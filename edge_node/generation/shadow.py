"""A language model's INT4/INT8 artifact watched on live traffic: a small sample of the
completed generations is scored by the version's FP32 reference, off the serving path.

A sampled generation (its prompt and the tokens the served artifact emitted) is run through
the reference graph **teacher-forced**: one forward pass over prompt + served tokens with an
empty KV cache, as the push's text guard runs a window (``central.quantize.llm.guard``). At
each served token the reference's log-probability of it and its argmax are kept, and counted
into ``ShadowInfo`` for the heartbeat:

* **greedy agreement** (``top1_agree`` / ``top1_samples``, per served token): the reference's
  argmax is the token served. Counted only for greedy requests (temperature 0, no repetition
  penalty), where the served token is the served artifact's own argmax: the guard's measure,
  on live prefixes. A sampled token says nothing about argmax agreement.
* **token log-probability** (``measure`` ``token_nll``, every sampled request): the sum over
  served tokens of their negative log-probability under the reference, and of its square
  (``samples`` counts the tokens). ``-measure_sum / samples`` is the served tokens' mean log
  probability under FP32: the live side of the guard's perplexity ratio (a served artifact
  whose tokens FP32 finds unlikely writes text FP32 would not).

The costs follow ``edge_node.inference.shadow``: one ``random()`` draw per completed request on
the serving path; a sampled one is copied into a small bounded queue (dropped and counted when
it is full, never waited on); one background thread runs the reference on a plain CPU session
with one intra-op thread and rests after each pass until its CPU time is at most ``cpu_share``
of the node's cores. A generation longer than :data:`MAX_TOKENS` (prompt and output) is not
scored and counts as dropped: its logits alone would hold ``tokens × vocab`` floats."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_node.generation.model import DecoderSpec
from edge_node.inference.shadow import CPU_SHARE, REFERENCE_ARTIFACT, reference_session
from fleetwire.mqtt.payloads import ShadowInfo

log = logging.getLogger(__name__)

__all__ = ["MAX_TOKENS", "TOKEN_NLL", "GenerationShadow"]

#: ``ShadowInfo.measure`` of a language model: the served tokens' negative log-probability under FP32.
TOKEN_NLL = "token_nll"
#: The longest prompt plus output scored; longer generations are dropped (counted).
MAX_TOKENS = 2048
#: Logit rows turned into log-probabilities at once (bounds the float64 copy).
_ROWS = 64

_Sample = tuple[list[int], list[int], bool]


@dataclass
class _Counts:
    """``ShadowInfo``'s counts while they grow."""

    samples: int = 0
    top1_agree: int = 0
    top1_samples: int = 0
    measure: str = ""
    measure_sum: float = 0.0
    measure_sumsq: float = 0.0
    dropped: int = 0


@dataclass(frozen=True)
class TokenScores:
    """The reference's view of one generation's served tokens."""

    logprobs: np.ndarray  # [served] float64
    agree: np.ndarray  # [served] bool: the reference's argmax is the served token


class GenerationShadow:
    """Scores a sample of one served language-model version's generations with its FP32 reference.

    ``offer`` is called once per completed generation; ``info`` is what the heartbeat reports;
    ``close`` stops the worker (what is queued then is not scored)."""

    def __init__(
        self,
        reference: ort.InferenceSession,
        spec: DecoderSpec,
        *,
        sample: float,
        queue_size: int = 8,
        cpu_share: float = CPU_SHARE,
        reference_name: str = REFERENCE_ARTIFACT,
        name: str = "shadow",
    ) -> None:
        self.sample = sample
        self._session = reference
        self._spec = spec
        self._feed_types = {i.name: i.type for i in reference.get_inputs()}
        #: CPU seconds the worker may use per second of wall time (0 or less: no limit).
        self._cpu_per_s = cpu_share * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        self._queue: queue.Queue[_Sample | None] = queue.Queue(maxsize=max(1, queue_size))
        self._lock = threading.Lock()
        self._reference_name = reference_name
        self._counts = _Counts(measure=TOKEN_NLL)
        self._failed = False
        self._closed = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, folder: Path, *, sample: float, queue_size: int, cpu_share: float, name: str) -> GenerationShadow:
        """The shadow of a version whose FP32 reference is assembled in ``folder`` (its graph
        and ``genai_config.json``); blocking."""
        spec = DecoderSpec.from_folder(folder)
        session = reference_session(folder / spec.filename)
        return cls(session, spec, sample=sample, queue_size=queue_size, cpu_share=cpu_share, name=name)

    def offer(self, prompt_ids: Sequence[int], token_ids: Sequence[int], greedy: bool) -> None:
        """Maybe sample one completed generation; never blocks. ``greedy``: the served tokens are
        the served artifact's argmax (temperature 0, no repetition penalty)."""
        if not token_ids or self._closed or random.random() >= self.sample:
            return
        if len(prompt_ids) + len(token_ids) > MAX_TOKENS:
            self._drop()
            return
        try:
            self._queue.put_nowait((list(prompt_ids), list(token_ids), greedy))
        except queue.Full:
            self._drop()

    def _drop(self) -> None:
        with self._lock:
            self._counts.dropped += 1

    def info(self) -> ShadowInfo:
        """The counts so far."""
        with self._lock:
            return ShadowInfo(reference=self._reference_name, **asdict(self._counts))

    def join(self) -> None:
        """Wait until every queued generation was scored (tests and benchmarks)."""
        self._queue.join()

    def close(self) -> None:
        """Stop the worker: queued generations are dropped, the reference session released."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        while True:
            try:
                self._queue.get_nowait()
                self._queue.task_done()
            except queue.Empty:
                break
        with contextlib.suppress(queue.Full):  # refilled meanwhile: the closing flag stops the worker
            self._queue.put_nowait(None)
        self._thread.join(timeout=10)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._closed:
                self._queue.task_done()
                return
            started = time.thread_time()
            try:
                self._score(*item)
            finally:
                self._queue.task_done()
            if self._rest(time.thread_time() - started):
                return

    def _rest(self, cpu_s: float) -> bool:
        """Rest so that ``cpu_s`` just spent stays within the budget; True once closed."""
        if 0 < self._cpu_per_s < 1:
            self._closing.wait(cpu_s / self._cpu_per_s - cpu_s)
        return self._closed

    def _score(self, prompt: list[int], served: list[int], greedy: bool) -> None:
        try:
            scores = self.scores(prompt, served)
        except Exception as exc:  # the reference failing must never touch serving; said once
            if not self._failed:
                self._failed = True
                log.warning("shadow %s: the reference run failed (%s); skipping such samples", self._thread.name, exc)
            return
        nll = np.maximum(0.0, -scores.logprobs)
        with self._lock:
            c = self._counts
            c.samples += int(nll.size)
            c.measure_sum += float(nll.sum())
            c.measure_sumsq += float((nll**2).sum())
            if greedy:
                c.top1_samples += int(scores.agree.size)
                c.top1_agree += int(scores.agree.sum())

    def scores(self, prompt: Sequence[int], served: Sequence[int]) -> TokenScores:
        """The reference teacher-forced over ``prompt`` + ``served``: each served token's
        log-probability and whether it is the argmax (one pass, empty KV cache)."""
        ids = np.asarray([[*prompt, *served[:-1]]], dtype=np.int64)
        (logits,) = self._session.run([self._spec.logits], self._feed(ids))
        rows = logits[0, len(prompt) - 1 :]  # the row at position i predicts token i + 1
        targets = np.asarray(served, dtype=np.int64)
        logprobs, agree = [], []
        for at in range(0, len(targets), _ROWS):
            chunk = rows[at : at + _ROWS].astype(np.float64)
            wanted = targets[at : at + _ROWS]
            top = chunk.max(axis=-1)
            lse = top + np.log(np.exp(chunk - top[:, None]).sum(axis=-1))
            logprobs.append(chunk[np.arange(wanted.size), wanted] - lse)
            agree.append(chunk.argmax(axis=-1) == wanted)
        return TokenScores(np.concatenate(logprobs), np.concatenate(agree))

    def _feed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Every input of the reference graph for one window: tokens, a full mask, positions
        (graphs that take them) and an empty cache."""
        s, length = self._spec, ids.shape[1]
        past = {s.past_key % layer for layer in range(s.layers)} | {s.past_value % layer for layer in range(s.layers)}
        feed: dict[str, np.ndarray] = {}
        for name, kind in self._feed_types.items():
            if name == s.input_ids:
                feed[name] = ids
            elif name == s.attention_mask:
                feed[name] = np.ones_like(ids)
            elif name in past:
                dtype = np.float16 if "float16" in kind else np.float32
                feed[name] = np.zeros((1, s.kv_heads, 0, s.head_size), dtype=dtype)
            elif "position" in name:
                feed[name] = np.arange(length, dtype=np.int64)[None, :]
        return feed
