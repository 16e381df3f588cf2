"""Errors of the inference layer.

Each one maps to a distinct HTTP answer (404, 503 with or without Retry-After, 400),
so the serving layer can translate them without inspecting messages. Every error
carries a human-readable message naming the model and, where known, the version."""

from __future__ import annotations


class InferenceError(Exception):
    """Base of every error raised by ``edge_node.inference``."""


class ModelNotFound(InferenceError):
    """No such model, or no such version of it (or the version was retired)."""


class ModelNotReady(InferenceError):
    """The version exists but cannot serve: still loading, or it failed to load.

    ``state`` is ``"loading"`` or ``"failed"``; ``reason`` is the load error, if any."""

    def __init__(self, message: str, *, state: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.state = state
        self.reason = reason


class ModelUnavailable(InferenceError):
    """The model (or its batcher) was retired or closed; the request was not run.

    Raised by ``infer`` after a version has been drained; a caller that resolves the
    model again with ``ModelRepository.get`` gets the version that replaced it."""


class QueueFull(InferenceError):
    """The model's queue holds as many rows as it may; retry after ``retry_after_s``.

    Raised immediately (never after waiting), so overload turns into fast 503s with a
    Retry-After hint instead of unbounded latency."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidInputs(InferenceError, ValueError):
    """The request's tensors do not fit the model (names, dtypes, ranks, batch axis).

    Checked before a request joins a batch, so one bad request can never fail the
    other requests it would have been batched with."""


class InvalidRequestData(InvalidInputs):
    """The model could not run on this request's values although their names, dtypes and
    ranks fit: an index past an embedding's vocabulary, shapes that do not fit together.
    ONNX Runtime found it while running; the node and the model are fine (400)."""


class InferenceFailed(InferenceError):
    """The node failed to run a request it accepted: out of memory, a broken session or
    device. The node's fault, not the request's (500)."""
