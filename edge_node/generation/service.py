"""The edge's generation service: what every text API (OpenAI-compatible, OIP generate)
calls, as :class:`~edge_node.inference.dataplane.DataPlane` is for ``infer``.

It looks the language model up in the repository, holds the request's place in the plane's
in-flight accounting (the same cap and load tracking as inference) for the whole stream,
and times each stream into vLLM-named Prometheus metrics. A transport turns its request into
prompt token ids and :class:`SamplingParams`, iterates :meth:`LanguageModels.stream` and
writes each :class:`StepOutput` in its own format."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass

from edge_node import errors
from edge_node.errors import InvalidRequest
from edge_node.generation.engine import GenerationEngine
from edge_node.generation.metrics import GenerationMetrics, RecentLatencies
from edge_node.generation.shadow import GenerationShadow
from edge_node.generation.types import Overloaded, SamplingParams, StepOutput
from edge_node.inference.dataplane import DataPlane, check_names
from edge_node.inference.repository import LoadedModel

__all__ = ["LanguageModel", "LanguageModels"]


@dataclass(frozen=True, slots=True)
class LanguageModel:
    """One served language-model version: its names, engine and when it became ready."""

    name: str
    version: str
    engine: GenerationEngine
    created: int
    """Unix time the version was loaded (OpenAI's ``created`` of a model)."""
    recent_ttfts: RecentLatencies
    """The version's last times to first token (its heartbeat's p50/p99)."""
    shadow: GenerationShadow | None = None
    """Scores a sample of its completed generations with the FP32 reference (a quantized
    artifact served), or None."""


class LanguageModels:
    """Generation over the plane's repository, for every text transport."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.metrics = GenerationMetrics(plane.repository.metrics_registry, self.served)

    def served(self) -> list[LanguageModel]:
        """Every language model whose default version serves now."""
        repository = self.plane.repository
        found = []
        for model in repository.models():
            if model.engine is None or model.state != "ready" or not repository.serves(model.name):
                continue
            if repository.get(model.name).version == model.version:
                found.append(_language_model(model))
        return found

    def get(self, name: str, version: str | None = None) -> LanguageModel:
        """The served language model ``name`` (404 if unknown, 400 if it is a tensor model)."""
        check_names(name, version)
        model = self.plane.repository.get(name, version)
        if model.engine is None:
            raise InvalidRequest(f"model {name!r} is not a language model: use POST /v2/models/{name}/infer")
        return _language_model(model)

    @contextlib.contextmanager
    def admitted(self, name: str) -> Iterator[None]:
        """Hold one in-flight place (the plane's cap) while the block runs. A full edge answers a
        text request 429 with Retry-After, as a full KV budget does: what OpenAI's clients and
        central's gateway read as "busy, retry", never as a failing node."""
        try:
            self.plane.check_admission(name, None)  # nothing runs between it and the place taken
        except errors.Overloaded as exc:
            raise Overloaded(str(exc), retry_after_s=exc.retry_after_s or 1.0) from None
        with self.plane.admitted(name, None):
            yield

    async def stream(
        self, model: LanguageModel, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncGenerator[StepOutput]:
        """The steps of one completion, timed into the metrics. Errors (400, 429, 503) come
        from the first ``__anext__``; closing the iterator cancels the sequence in the engine.
        A completed stream is offered to the version's live shadow (a random draw; a sampled
        one is queued for the FP32 reference, never awaited)."""
        rid = request_id or uuid.uuid4().hex
        started = time.perf_counter()
        last: float | None = None
        served: list[int] = []
        steps = model.engine.generate(prompt_ids, params, rid)
        try:
            async for step in steps:
                now = time.perf_counter()
                first, seconds = last is None, now - (last if last is not None else started)
                self.metrics.step(model.name, seconds, first=first)
                if first:
                    model.recent_ttfts.observe(seconds)
                    self.metrics.first_token(model.name, step.queued_s, step.prefill_s)
                last = now
                served += step.token_ids
                if step.finish_reason is not None:
                    self.metrics.finished(model.name, now - started, step.finish_reason)
                    if model.shadow is not None:
                        model.shadow.offer(prompt_ids, served, greedy=_argmax_decoding(params))
                yield step
        finally:
            await steps.aclose()  # type: ignore[attr-defined]  # the engine returns an async generator


def _argmax_decoding(params: SamplingParams) -> bool:
    """Whether every token of the stream is the model's argmax (what greedy agreement compares)."""
    return params.greedy and params.repetition_penalty == 1.0


def _language_model(model: LoadedModel) -> LanguageModel:
    assert model.engine is not None
    created = int(model.switched_at or time.time())
    shadow = model.shadow if isinstance(model.shadow, GenerationShadow) else None
    return LanguageModel(model.name, model.version, model.engine, created, model.recent_ttfts, shadow)
