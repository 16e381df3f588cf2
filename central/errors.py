"""Central's errors. Each carries its HTTP status and the name of its gRPC status code
(``rpc_status``) so both transports answer the same failure the same way (one map, here;
``central.grpc.status`` turns the name into grpc's enum)."""

from __future__ import annotations


class CentralError(Exception):
    """Base of every error central reports to a client."""

    http_status = 500
    rpc_status = "INTERNAL"

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
    rpc_status = "INVALID_ARGUMENT"


class InvalidName(CentralError):
    """A model name or version label that is not path-safe."""

    http_status = 422
    rpc_status = "INVALID_ARGUMENT"


class NotFound(CentralError):
    """Unknown model, version or chunk."""

    http_status = 404
    rpc_status = "NOT_FOUND"


class Conflict(CentralError):
    """The version exists already, or is in use."""

    http_status = 409
    rpc_status = "ALREADY_EXISTS"


class TooLarge(CentralError):
    """An upload over the configured limit."""

    http_status = 413
    rpc_status = "RESOURCE_EXHAUSTED"


class InsufficientStorage(CentralError):
    """Central's disk cannot hold an upload (staging, then its chunks): nothing was kept."""

    http_status = 507
    rpc_status = "RESOURCE_EXHAUSTED"


class FetchFromOwners(CentralError):
    """Origin protection: the requester must try the chunk's owners first."""

    http_status = 409
    rpc_status = "FAILED_PRECONDITION"


class AccuracyGuardFailed(CentralError):
    """INT8 disagrees with FP32 more than the threshold allows, and FP32 was not asked for."""

    http_status = 422
    rpc_status = "FAILED_PRECONDITION"


class QuantizationFailed(CentralError):
    """onnxruntime could not produce a loadable INT8 model, and FP32 was not asked for."""

    http_status = 422
    rpc_status = "FAILED_PRECONDITION"


class Unauthenticated(CentralError):
    """No credential, or one central does not know."""

    http_status = 401
    rpc_status = "UNAUTHENTICATED"


class PermissionDenied(CentralError):
    """A known caller asking for what its credential does not allow."""

    http_status = 403
    rpc_status = "PERMISSION_DENIED"


class Overloaded(CentralError):
    """A bounded queue or pool is full (uploads, origin streams): nothing was done; the
    client should retry after ``retry_after_s``."""

    http_status = 503
    rpc_status = "RESOURCE_EXHAUSTED"

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
    rpc_status = "UNAVAILABLE"

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
