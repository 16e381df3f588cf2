"""Prometheus metrics of the language models an edge serves, named after vLLM's so its
dashboards carry over (``vllm:time_to_first_token_seconds``, ``vllm:num_requests_running``…),
labelled ``model_name``.

Latencies are histograms the service observes per stream; token counts, queue sizes, KV
usage and prefix-cache counters are read from each engine's :meth:`stats` when scraped (a
collector), so they cost nothing on the decode path. The counters restart with a new
version's engine, which Prometheus' ``rate`` treats as a counter reset.

A histogram cannot say what the p99 is *now*; each version also keeps its last TTFTs in a
:class:`RecentLatencies` ring, whose p50/p99 the heartbeat carries (central's dashboard)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from edge_node.generation.service import LanguageModel

__all__ = ["RECENT_TTFTS", "GenerationMetrics", "RecentLatencies"]

_LABEL = "model_name"
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
#: Times to first token a version keeps for its heartbeat's p50/p99 (the newest win).
RECENT_TTFTS = 256


class RecentLatencies:
    """The last ``size`` latencies of one served version, and their percentiles (nearest rank).

    Appending is O(1) on the stream's path; sorting 256 floats happens once per heartbeat."""

    def __init__(self, size: int = RECENT_TTFTS) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self._seconds: deque[float] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._seconds)

    def observe(self, seconds: float) -> None:
        """One more latency; the oldest drops out once ``size`` are kept."""
        self._seconds.append(max(0.0, seconds))

    def percentiles_ms(self, *quantiles: float) -> tuple[float, ...] | None:
        """The kept latencies' ``quantiles`` (each in (0, 1]) in milliseconds; None when none was kept."""
        if not self._seconds:
            return None
        ordered = sorted(self._seconds)
        last = len(ordered) - 1
        return tuple(round(1000 * ordered[min(last, max(0, math.ceil(q * len(ordered)) - 1))], 3) for q in quantiles)


class GenerationMetrics:
    """The vLLM-named families in ``registry``; ``served()`` lists the models to read stats from."""

    def __init__(self, registry: CollectorRegistry, served: Callable[[], Sequence[LanguageModel]]) -> None:
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", [_LABEL], registry=registry,
            buckets=_TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Time between two generated tokens of a stream.", [_LABEL],
            registry=registry, buckets=_ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Whole request latency, first byte to last token.", [_LABEL],
            registry=registry, buckets=_E2E_BUCKETS,
        )  # fmt: skip
        self.queue = Histogram(
            "vllm:request_queue_time_seconds", "Time a request waited for a batch row and KV room.", [_LABEL],
            registry=registry, buckets=_TTFT_BUCKETS,
        )  # fmt: skip
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds", "Time from a request's admission to its first token.", [_LABEL],
            registry=registry, buckets=_TTFT_BUCKETS,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success", "Requests that finished, by finish reason.", [_LABEL, "finished_reason"],
            registry=registry,
        )  # fmt: skip
        registry.register(_EngineCollector(served))

    def step(self, model: str, seconds: float, *, first: bool) -> None:
        """One step of a stream arrived ``seconds`` after the previous one (or the request)."""
        (self.ttft if first else self.itl).labels(model).observe(seconds)

    def first_token(self, model: str, queued_s: float, prefill_s: float) -> None:
        """Where a stream's time to first token went: waiting for room, then prefill."""
        self.queue.labels(model).observe(queued_s)
        self.prefill.labels(model).observe(prefill_s)

    def finished(self, model: str, seconds: float, reason: str) -> None:
        """A stream ended with ``reason`` after ``seconds``."""
        self.e2e.labels(model).observe(seconds)
        self.success.labels(model, reason).inc()


class _EngineCollector(Collector):
    """Reads every served engine's counters when scraped."""

    def __init__(self, served: Callable[[], Sequence[LanguageModel]]) -> None:
        self._served = served

    def collect(self) -> Iterable[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "prompt": CounterMetricFamily("vllm:prompt_tokens", "Prompt tokens admitted.", labels=[_LABEL]),
            "generation": CounterMetricFamily("vllm:generation_tokens", "Tokens generated.", labels=[_LABEL]),
            "queries": CounterMetricFamily(
                "vllm:prefix_cache_queries", "Prompt KV blocks looked up in the prefix cache.", labels=[_LABEL]
            ),
            "hits": CounterMetricFamily(
                "vllm:prefix_cache_hits", "Prompt KV blocks found in the prefix cache.", labels=[_LABEL]
            ),
            "prefill_s": CounterMetricFamily(
                "modelfleet_generation_prefill_seconds",
                "Seconds the engine spent running prefill chunks.",
                labels=[_LABEL],
            ),
            "decode_s": CounterMetricFamily(
                "modelfleet_generation_decode_seconds",
                "Seconds the engine spent running decode steps.",
                labels=[_LABEL],
            ),
            "prefilled": CounterMetricFamily(
                "modelfleet_generation_prefilled_tokens",
                "Prompt tokens run through the model (cache misses).",
                labels=[_LABEL],
            ),
            "warmed": CounterMetricFamily(
                "modelfleet_generation_warmed_tokens",
                "Tokens run to cache finished chat turns ahead of their next prompt.",
                labels=[_LABEL],
            ),
            "warm_s": CounterMetricFamily(
                "modelfleet_generation_warm_seconds",
                "Seconds the engine spent warming finished chat turns.",
                labels=[_LABEL],
            ),
            "running": GaugeMetricFamily("vllm:num_requests_running", "Sequences in the batch.", labels=[_LABEL]),
            "waiting": GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for room.", labels=[_LABEL]),
            "kv": GaugeMetricFamily(
                "vllm:kv_cache_usage_perc", "Share of the KV budget in use (0..1).", labels=[_LABEL]
            ),
        }
        for model in self._served():
            s = model.engine.stats()
            values = {
                "prompt": s.prompt_tokens, "generation": s.generation_tokens, "queries": s.prefix_queries,
                "hits": s.prefix_hits, "prefill_s": s.prefill_seconds, "decode_s": s.decode_seconds,
                "prefilled": s.prefilled_tokens, "warmed": s.warmed_tokens, "warm_s": s.warm_seconds,
                "running": s.running, "waiting": s.waiting, "kv": s.kv_usage,
            }  # fmt: skip
            for key, value in values.items():
                families[key].add_metric([model.name], float(value))
        return families.values()
