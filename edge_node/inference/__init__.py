"""Serving ONNX models on the edge: provider probing, cached optimized sessions,
dynamic batching, per-model metrics and a repository with zero-downtime swaps."""

from __future__ import annotations

from edge_node.inference.batcher import DynamicBatcher
from edge_node.inference.errors import (
    InferenceError,
    InvalidInputs,
    ModelNotFound,
    ModelNotReady,
    ModelUnavailable,
    QueueFull,
)
from edge_node.inference.metrics import CONTENT_TYPE_LATEST, ModelMetrics, render
from edge_node.inference.providers import available_providers
from edge_node.inference.repository import LoadedModel, ModelRepository, ModelState
from edge_node.inference.session import CreatedSession, SessionFactory

__all__ = [
    "CONTENT_TYPE_LATEST",
    "CreatedSession",
    "DynamicBatcher",
    "InferenceError",
    "InvalidInputs",
    "LoadedModel",
    "ModelMetrics",
    "ModelNotFound",
    "ModelNotReady",
    "ModelRepository",
    "ModelState",
    "ModelUnavailable",
    "QueueFull",
    "SessionFactory",
    "available_providers",
    "render",
]
