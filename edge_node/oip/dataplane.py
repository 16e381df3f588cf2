"""The edge's inference service: what the Open Inference Protocol offers, whatever carries it.

REST (``edge_node.oip.routes``) and KServe v2 gRPC (``edge_node.oip.grpc_servicer``) are thin
transports over one :class:`DataPlane` (as MLServer's ``DataPlane`` serves its REST and gRPC
servers): model lookup, name checks, the in-flight cap, load tracking, request checks, the
batcher and every error live here once, so the two transports cannot drift apart. A transport
decodes its wire format into an :class:`~edge_node.oip.codec.InferRequest`, calls the plane, and
maps a :class:`PlaneError` to its own status (:attr:`PlaneError.status` is the HTTP one; gRPC
maps it with ``grpc_code``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_node.heartbeat.load import LoadTracker
from edge_node.inference.errors import (
    InferenceFailed,
    InvalidInputs,
    ModelNotFound,
    ModelNotReady,
    ModelUnavailable,
    QueueFull,
)
from edge_node.inference.repository import LoadedModel, ModelRepository
from edge_node.oip.codec import InferRequest, OipError
from edge_node.oip.config import triton_config
from edge_node.oip.datatypes import oip_datatype
from edge_node.oip.validate import check_request
from fleetwire.manifest import TensorSpec
from fleetwire.names import InvalidName, check_name

log = logging.getLogger(__name__)

SERVER_NAME = "modelfleet-edge"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]
PLATFORM = "onnxruntime_onnx"
#: Default cap on one inference request body (the edge's ``limits.max_infer_body_bytes``).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class PlaneError(Exception):
    """A request the plane refuses or could not run. ``status`` is the HTTP status it means
    (a transport maps it to its own); ``retry_after_s`` is set on an overload."""

    def __init__(self, message: str, status: int, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> dict[str, str] | None:
        """``Retry-After`` (whole seconds, at least 1) when the request may be retried."""
        if self.retry_after_s is None:
            return None
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


@dataclass(frozen=True)
class OipLimits:
    """Caps on one inference request (the edge's ``limits`` settings)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_tensor_elements: int = 16 * 1024 * 1024
    max_inflight_requests: int = 128


@dataclass(frozen=True)
class InferResult:
    """What one inference gave: the model that ran it and the outputs asked for."""

    model: LoadedModel
    outputs: dict[str, np.ndarray]


def _tensor_meta(specs: list[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": oip_datatype(s.dtype), "shape": s.shape} for s in specs]


def check_names(name: str, version: str | None) -> None:
    """422 naming the rule when ``name`` or ``version`` is no valid name (a trailing newline,
    a slash…): central never stores such a model, so "not found" would hide the real mistake."""
    try:
        check_name("model name", name)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        raise PlaneError(str(exc), 422) from None


def lookup_error(exc: Exception) -> PlaneError:
    """The plane's error for a failed lookup or a refused run (404, 503 with or without a retry)."""
    if isinstance(exc, ModelNotFound):
        return PlaneError(str(exc), 404)
    if isinstance(exc, QueueFull):
        return PlaneError(str(exc), 503, retry_after_s=exc.retry_after_s)
    return PlaneError(str(exc), 503)


class DataPlane:
    """Inference on one repository, for every transport. ``load`` (if given) sees every
    inference; ``limits`` caps tensor sizes and the requests in progress."""

    def __init__(
        self,
        repository: ModelRepository,
        version: str,
        *,
        load: LoadTracker | None = None,
        limits: OipLimits | None = None,
    ) -> None:
        self.repository = repository
        self.version = version
        self.load = load
        self.limits = limits or OipLimits()
        self.inflight = 0
        """Inference requests in progress, over every transport."""

    # ----------------------------------------------------------------- server

    def live(self) -> bool:
        """The process answers (a transport that can call this is live)."""
        return True

    def ready(self) -> bool:
        """Every version this edge should serve is loaded."""
        return self.repository.ready()

    def server_metadata(self) -> dict[str, Any]:
        """Name, version and protocol extensions."""
        return {"name": SERVER_NAME, "version": self.version, "extensions": EXTENSIONS}

    # ----------------------------------------------------------------- models

    def model(self, name: str, version: str | None) -> LoadedModel:
        """The served model (the version the repository chooses when ``version`` is None)."""
        check_names(name, version)
        try:
            return self.repository.get(name, version)
        except (ModelNotFound, ModelNotReady) as exc:
            raise lookup_error(exc) from None

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model serves now (PlaneError 404 when this edge has no such model)."""
        check_names(name, version)
        try:
            self.repository.get(name, version)
        except ModelNotFound as exc:
            raise PlaneError(str(exc), 404) from None
        except ModelNotReady:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The OIP model metadata document: versions ready here, platform, tensors."""
        model = self.model(name, version)
        versions = sorted({m.version for m in self.repository.models() if m.name == name and m.state == "ready"})
        return {
            "name": model.name,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": _tensor_meta(model.manifest.inputs),
            "outputs": _tensor_meta(model.manifest.outputs),
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """Triton's ``model_config`` document of the model."""
        return triton_config(self.model(name, version), self.repository)

    # ----------------------------------------------------------------- inference

    @contextlib.contextmanager
    def admitted(self, name: str, version: str | None) -> Iterator[None]:
        """Count one inference request as in progress (and as load) while the block runs,
        reading its body included; refuse it first with a bad name (422) or when too many are
        in progress (503, retry in a second). Every request in progress may hold a whole body;
        each model's batcher bounds its queue in rows, this bounds the requests in front of
        (and inside) all of them."""
        check_names(name, version)
        if self.inflight >= self.limits.max_inflight_requests:
            raise PlaneError(
                f"{self.inflight} inference requests are in progress here"
                " (limits.max_inflight_infer_requests); retry shortly",
                503,
                retry_after_s=1.0,
            )
        self.inflight += 1
        started = self.load.begin() if self.load is not None else None
        try:
            yield
        finally:
            if self.load is not None and started is not None:
                self.load.end(started)
            self.inflight -= 1

    async def infer(self, name: str, version: str | None, decode: Callable[[LoadedModel], InferRequest]) -> InferResult:
        """Run one admitted request. ``decode(model)`` turns the transport's payload into an
        :class:`InferRequest` (raising :class:`OipError` on a bad one); it runs after the
        lookup, and the lookup after the body was read, so no version swap falls between
        lookup and run."""
        try:
            model = self.repository.get(name, version)
            request = decode(model)
            check_request(request, model.manifest.inputs, model.manifest.outputs)
            priority = request.parameters.get("priority", 0)
            outputs = await model.infer(request.inputs, priority=priority if isinstance(priority, int) else 0)
        except OipError as exc:
            raise PlaneError(str(exc), exc.status) from None
        except InvalidInputs as exc:
            raise PlaneError(str(exc), 400) from None
        except (ModelNotFound, ModelNotReady, ModelUnavailable, QueueFull) as exc:
            raise lookup_error(exc) from None
        except InferenceFailed as exc:
            log.warning("%s: %s", name, exc)
            raise PlaneError(str(exc), 500) from None
        wanted = request.requested_outputs
        return InferResult(model, {k: v for k, v in outputs.items() if wanted is None or k in wanted})
