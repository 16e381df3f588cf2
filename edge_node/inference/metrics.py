"""Prometheus metrics of the inference layer, per model version.

The metric families live in a ``CollectorRegistry`` the edge owns (never the global
one), so several edges or tests in one process do not collide. The families of one
registry are created once and shared by every ``ModelMetrics`` bound to it."""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ModelMetrics", "Outcome", "render"]

#: Request outcomes counted in ``modelfleet_inference_requests_total``.
Outcome = Literal["ok", "error", "queue_full", "cancelled", "unavailable", "invalid"]

_LABELS = ("model", "version")
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_INFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class _Families:
    """The labelled metric families registered in one registry."""

    requests: Counter
    batch_size: Histogram
    queue_seconds: Histogram
    inference_seconds: Histogram
    queue_rows: Gauge


_families: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def _create(registry: CollectorRegistry) -> _Families:
    return _Families(
        requests=Counter(
            "modelfleet_inference_requests",
            "Inference requests by outcome (ok, error, queue_full, cancelled, unavailable, invalid).",
            (*_LABELS, "outcome"),
            registry=registry,
        ),
        batch_size=Histogram(
            "modelfleet_inference_batch_size",
            "Rows per executed batch.",
            _LABELS,
            registry=registry,
            buckets=_BATCH_BUCKETS,
        ),
        queue_seconds=Histogram(
            "modelfleet_inference_queue_seconds",
            "Time a request waited in the batch queue.",
            _LABELS,
            registry=registry,
            buckets=_QUEUE_BUCKETS,
        ),
        inference_seconds=Histogram(
            "modelfleet_inference_seconds",
            "Time one batch spent in the session run.",
            _LABELS,
            registry=registry,
            buckets=_INFER_BUCKETS,
        ),
        queue_rows=Gauge(
            "modelfleet_inference_queue_rows", "Rows waiting in the batch queue.", _LABELS, registry=registry
        ),
    )


def _families_of(registry: CollectorRegistry) -> _Families:
    """The families of ``registry``, registering them on first use (thread-safe)."""
    with _families_lock:
        found = _families.get(registry)
        if found is None:
            found = _families[registry] = _create(registry)
        return found


class ModelMetrics:
    """The metrics of one model version: small methods the batcher calls."""

    def __init__(self, registry: CollectorRegistry, model: str, version: str) -> None:
        self._f = _families_of(registry)
        self.model = model
        self.version = version
        labels = {"model": model, "version": version}
        self._batch_size = self._f.batch_size.labels(**labels)
        self._queue_seconds = self._f.queue_seconds.labels(**labels)
        self._inference_seconds = self._f.inference_seconds.labels(**labels)
        self._queue_rows = self._f.queue_rows.labels(**labels)
        self._requests: dict[str, Any] = {}
        #: Requests of this version that failed in the session (heartbeats report it, so
        #: central's rollout controller can count a version that errors as failed).
        self.errors = 0

    def request(self, outcome: Outcome) -> None:
        """Count one finished request with its outcome (label children cached: hot path)."""
        if outcome == "error":
            self.errors += 1
        child = self._requests.get(outcome)
        if child is None:
            child = self._requests[outcome] = self._f.requests.labels(
                model=self.model, version=self.version, outcome=outcome
            )
        child.inc()

    def batch(self, rows: int, seconds: float) -> None:
        """Record one executed batch: its rows and its time in the session."""
        self._batch_size.observe(rows)
        self._inference_seconds.observe(seconds)

    def queued(self, seconds: float) -> None:
        """Record how long one request waited before its batch started."""
        self._queue_seconds.observe(seconds)

    def queue_depth(self, rows: int) -> None:
        """Set the rows now waiting in the queue."""
        self._queue_rows.set(rows)

    def retire(self) -> None:
        """Drop the queue-depth series of a retired version (a dead queue has no depth).

        Counters and histograms stay so totals are not lost on a swap."""
        with contextlib.suppress(KeyError):
            self._f.queue_rows.remove(self.model, self.version)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format (serve with ``CONTENT_TYPE_LATEST``)."""
    return generate_latest(registry)
