"""The edge's one error family: each error answers with its HTTP status over REST and the
gRPC code of that status (one map, ``fleetwire.kserve.status``), ``Retry-After`` on overload."""

from __future__ import annotations

import grpc
import pytest

from edge_node.errors import (
    BodyTooLarge,
    EdgeError,
    InferenceFailed,
    InvalidInputs,
    InvalidModelName,
    InvalidRequest,
    InvalidRequestData,
    ModelNotFound,
    ModelNotReady,
    ModelUnavailable,
    QueueFull,
    TensorTooLarge,
)
from fleetwire.kserve.status import grpc_code


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (InvalidRequest("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (InvalidInputs("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (InvalidRequestData("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (TensorTooLarge("x"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (BodyTooLarge("x"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (InvalidModelName("x"), 422, grpc.StatusCode.INVALID_ARGUMENT),
        (ModelNotFound("x"), 404, grpc.StatusCode.NOT_FOUND),
        (ModelNotReady("x", state="loading"), 503, grpc.StatusCode.UNAVAILABLE),
        (ModelUnavailable("x"), 503, grpc.StatusCode.UNAVAILABLE),
        (QueueFull("x", retry_after_s=0.2), 503, grpc.StatusCode.UNAVAILABLE),
        (InferenceFailed("x"), 500, grpc.StatusCode.INTERNAL),
    ],
)
def test_every_edge_error_has_its_status_and_grpc_code(error: EdgeError, status: int, code: grpc.StatusCode) -> None:
    assert isinstance(error, EdgeError)
    assert error.status == status and grpc_code(error.status) == code


def test_only_an_overload_says_when_to_retry_and_never_sooner_than_a_second() -> None:
    assert QueueFull("full", retry_after_s=0.2).retry_after_header == {"Retry-After": "1"}
    assert QueueFull("full", retry_after_s=2.6).retry_after_header == {"Retry-After": "3"}
    assert ModelNotReady("loading", state="loading").retry_after_header is None
