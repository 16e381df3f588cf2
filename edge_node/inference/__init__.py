"""Serving ONNX models on the edge: the data plane every transport calls, provider probing,
cached optimized sessions, the one input check, dynamic batching, per-model metrics, load
figures and a repository with zero-downtime swaps. No web framework or gRPC is imported
here: the transports (``edge_node.rest``, ``edge_node.grpc``) sit on top."""

from __future__ import annotations

from edge_node.inference.batcher import DynamicBatcher
from edge_node.inference.dataplane import DataPlane, InferLimits, InferResult
from edge_node.inference.inputs import check_inputs
from edge_node.inference.load import LoadTracker, percentile
from edge_node.inference.metrics import CONTENT_TYPE_LATEST, ModelMetrics, render
from edge_node.inference.providers import available_providers
from edge_node.inference.repository import LoadedModel, ModelRepository, ModelState
from edge_node.inference.request import InferRequest
from edge_node.inference.session import CreatedSession, SessionFactory

__all__ = [
    "CONTENT_TYPE_LATEST",
    "CreatedSession",
    "DataPlane",
    "DynamicBatcher",
    "InferLimits",
    "InferRequest",
    "InferResult",
    "LoadTracker",
    "LoadedModel",
    "ModelMetrics",
    "ModelRepository",
    "ModelState",
    "SessionFactory",
    "available_providers",
    "check_inputs",
    "percentile",
    "render",
]
