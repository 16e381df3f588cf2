"""Central's errors. Each carries its HTTP status and gRPC code so both transports
answer the same failure the same way (one map, here)."""

from __future__ import annotations

import grpc


class CentralError(Exception):
    """Base of every error central reports to a client."""

    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_headers(self) -> dict[str, str] | None:
        """Headers the REST answer carries besides ``{"error": message}``."""
        return None


class BadRequest(CentralError):
    """Input that cannot be used: not ONNX, truncated, malformed fields."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidName(CentralError):
    """A model name or version label that is not path-safe."""

    http_status = 422
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CentralError):
    """Unknown model, version or chunk."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class Conflict(CentralError):
    """The version exists already, or is in use."""

    http_status = 409
    grpc_code = grpc.StatusCode.ALREADY_EXISTS


class TooLarge(CentralError):
    """An upload over the configured limit."""

    http_status = 413
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class InsufficientStorage(CentralError):
    """Central's disk cannot hold an upload (staging, then its chunks): nothing was kept."""

    http_status = 507
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FetchFromOwners(CentralError):
    """Origin protection: the requester must try the chunk's owners first."""

    http_status = 409
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class AccuracyGuardFailed(CentralError):
    """INT8 disagrees with FP32 more than the threshold allows, and FP32 was not asked for."""

    http_status = 422
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class QuantizationFailed(CentralError):
    """onnxruntime could not produce a loadable INT8 model, and FP32 was not asked for."""

    http_status = 422
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(CentralError):
    """No credential, or one central does not know."""

    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(CentralError):
    """A known caller asking for what its credential does not allow."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class Overloaded(CentralError):
    """A bounded queue or pool is full (uploads, origin streams): nothing was done; the
    client should retry after ``retry_after_s``."""

    http_status = 503
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def http_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class StoreUnavailable(CentralError):
    """PostgreSQL or the object store did not answer (restarting, failing over): nothing was
    written; the client should retry after ``retry_after_s``."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def http_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


def unavailable_store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the metadata or blob store is away for now", of the store
    clients installed (psycopg, obstore are extras): they become ``StoreUnavailable``."""
    found: list[type[BaseException]] = []
    try:
        import psycopg

        found.append(psycopg.OperationalError)  # PoolTimeout is one too
    except ImportError:
        pass
    try:
        from obstore.exceptions import GenericError

        found.append(GenericError)
    except ImportError:
        pass
    return tuple(found)
