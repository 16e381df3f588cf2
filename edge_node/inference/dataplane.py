"""The edge's inference service: what the Open Inference Protocol offers, whatever carries it.

REST (``edge_node.rest``) and KServe v2 gRPC (``edge_node.grpc``) are thin transports over one
:class:`DataPlane` (as MLServer's ``DataPlane`` serves its REST and gRPC servers): model
lookup, name checks, the in-flight cap, load tracking, the batcher and every error live here
once, so the two transports cannot drift apart. A transport decodes its wire format into an
:class:`~edge_node.inference.request.InferRequest`, calls the plane, and answers an
:class:`~edge_node.errors.EdgeError` with its ``status`` (gRPC with that status's code)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_node.errors import InferenceFailed, InvalidModelName, ModelNotReady, Overloaded
from edge_node.inference.datatypes import oip_datatype
from edge_node.inference.inputs import check_outputs
from edge_node.inference.load import LoadTracker
from edge_node.inference.repository import LoadedModel, ModelRepository
from edge_node.inference.request import InferRequest
from edge_node.inference.triton_config import triton_config
from fleetwire.manifest import KIND_DECODER, SERVED_BY, TensorSpec
from fleetwire.names import InvalidName, check_name

__all__ = ["DataPlane", "InferLimits", "InferResult"]

log = logging.getLogger(__name__)

SERVER_NAME = "modelfleet-edge"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]
PLATFORM = "onnxruntime_onnx"
#: Default cap on one inference request body (the edge's ``limits.max_infer_body_bytes``).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class InferLimits:
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
    """InvalidModelName (422) naming the rule when ``name`` or ``version`` is no valid name
    (a trailing newline, a slash…): central never stores such a model, so "not found" would
    hide the real mistake."""
    try:
        check_name("model name", name)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        raise InvalidModelName(str(exc)) from None


class DataPlane:
    """Inference on one repository, for every transport. ``load`` (if given) sees every
    inference; ``limits`` caps tensor sizes and the requests in progress."""

    def __init__(
        self,
        repository: ModelRepository,
        version: str,
        *,
        load: LoadTracker | None = None,
        limits: InferLimits | None = None,
    ) -> None:
        self.repository = repository
        self.version = version
        self.load = load
        self.limits = limits or InferLimits()
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
        return self.repository.get(name, version)

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model serves now (ModelNotFound, 404, when this edge has no such model)."""
        check_names(name, version)
        try:
            self.repository.get(name, version)
        except ModelNotReady:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The OIP model metadata document: versions ready here, platform, tensors."""
        model = self.model(name, version)
        versions = sorted({m.version for m in self.repository.models() if m.name == name and m.state == "ready"})
        if model.engine is not None:  # a language model: no tensors; the text APIs serve it
            served_by = [path.format(name=model.name) for path in SERVED_BY[KIND_DECODER]]
            return {"name": model.name, "versions": versions, "platform": PLATFORM, "inputs": [], "outputs": [],
                    "parameters": {"kind": KIND_DECODER, "served_by": served_by}}  # fmt: skip
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

    def check_admission(self, name: str, version: str | None) -> None:
        """Refuse a request with a bad name (422) or when every place is taken (503, retry in
        a second): what a transport asks before it reads a body, so a full edge reads none."""
        check_names(name, version)
        if self.inflight >= self.limits.max_inflight_requests:
            raise Overloaded(
                f"{self.inflight} inference requests are in progress here"
                " (limits.max_inflight_infer_requests); retry shortly",
                retry_after_s=1.0,
            )

    @contextlib.contextmanager
    def admitted(self, name: str, version: str | None) -> Iterator[None]:
        """Count one inference request, its body in hand, as in progress (and as load) while
        the block runs; refuse it first as ``check_admission`` does. A body still arriving
        holds no place (the HTTP listener's ``limits.body_timeout_s`` bounds its time, the
        body cap its size). Each model's batcher bounds its queue in rows, this bounds the
        requests in front of (and inside) all of them."""
        self.check_admission(name, version)
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
        :class:`InferRequest` (raising InvalidRequest on a bad one); it runs after the
        lookup, and the lookup after the body was read, so no version swap falls between
        lookup and run. The model checks the inputs (``edge_node.inference.inputs``)."""
        model = self.repository.get(name, version)
        request = decode(model)
        check_outputs(request.requested_outputs, model.manifest.outputs)
        priority = request.parameters.get("priority", 0)
        try:
            outputs = await model.infer(request.inputs, priority=priority if isinstance(priority, int) else 0)
        except InferenceFailed as exc:
            log.warning("%s: %s", name, exc)
            raise
        wanted = request.requested_outputs
        return InferResult(model, {k: v for k, v in outputs.items() if wanted is None or k in wanted})
