"""The edge's errors: one family, each carrying the HTTP status it is answered with.

Every error an inference client can meet is an :class:`EdgeError`; the inference layer, the
data plane and the transports raise these and nothing else, so REST answers ``status`` (and
``Retry-After`` from ``retry_after_s``) and KServe gRPC ends the call with the code of that
status. The HTTP → gRPC map is one table, ``fleetwire.kserve.status``, shared with central's
gateway so an edge and the gateway refuse a request with the same code; keeping it there also
keeps this module free of gRPC (``edge_node.inference`` imports it). Messages name the model
and, where known, the version or the input, since a client reads them to fix its request."""

from __future__ import annotations

__all__ = [
    "BodyTooLarge",
    "EdgeError",
    "InferenceFailed",
    "InvalidInputs",
    "InvalidModelName",
    "InvalidRequest",
    "InvalidRequestData",
    "ModelNotFound",
    "ModelNotReady",
    "ModelUnavailable",
    "Overloaded",
    "QueueFull",
    "TensorTooLarge",
]


class EdgeError(Exception):
    """Base of every error the edge reports to an inference client. ``status`` is the HTTP
    status it means; ``retry_after_s`` is set when the client may simply retry later."""

    status = 500
    retry_after_s: float | None = None

    @property
    def retry_after_header(self) -> dict[str, str] | None:
        """``Retry-After`` (whole seconds, at least 1) when the request may be retried."""
        if self.retry_after_s is None:
            return None
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(EdgeError):
    """A malformed or unacceptable request (its JSON, a header, a tensor's encoding): 400."""

    status = 400


class InvalidInputs(InvalidRequest):
    """The request's tensors do not fit the model (names, datatypes, ranks, batch axis): 400.

    Checked before a request joins a batch (``edge_node.inference.inputs``), so one bad
    request can never fail the other requests it would have been batched with."""


class InvalidRequestData(InvalidInputs):
    """The model could not run on this request's values although their names, dtypes and
    ranks fit: an index past an embedding's vocabulary, shapes that do not fit together.
    ONNX Runtime found it while running; the node and the model are fine (400)."""


class TensorTooLarge(InvalidRequest):
    """An input declares more elements than the edge accepts (``limits.max_tensor_elements``): 413."""

    status = 413


class BodyTooLarge(InvalidRequest):
    """The request body exceeds ``limits.max_infer_body_bytes``: 413."""

    status = 413


class InvalidModelName(EdgeError):
    """A model name or version no model can have (a slash, a trailing newline…): 422, naming
    the rule, since "not found" would hide the real mistake."""

    status = 422


class ModelNotFound(EdgeError):
    """No such model, or no such version of it (or the version was retired): 404."""

    status = 404


class ModelNotReady(EdgeError):
    """The version exists but cannot serve: still loading, or it failed to load (503).

    ``state`` is ``"loading"`` or ``"failed"``; ``reason`` is the load error, if any."""

    status = 503

    def __init__(self, message: str, *, state: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.state = state
        self.reason = reason


class ModelUnavailable(EdgeError):
    """The model (or its batcher) was retired or closed; the request was not run (503).

    Raised by ``infer`` after a version has been drained; a caller that resolves the
    model again with ``ModelRepository.get`` gets the version that replaced it."""

    status = 503


class Overloaded(EdgeError):
    """A bounded queue is full; nothing was done. Retry after ``retry_after_s`` (503).

    Raised immediately (never after waiting), so overload turns into fast 503s with a
    Retry-After hint instead of unbounded latency."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(Overloaded):
    """One model's batch queue holds as many rows as it may (``inference.batching.max_queue_rows``)."""


class InferenceFailed(EdgeError):
    """The node failed to run a request it accepted: out of memory, a broken session or
    device. The node's fault, not the request's (500)."""
