"""A model's configuration in the shape of Triton's ``model_config`` JSON, served at
``GET /v2/models/{m}[/versions/{v}]/config`` (Triton's model configuration extension), so
Triton's clients and tools (``get_model_config``, perf_analyzer) can read it.

With ``max_batch_size`` above 0 Triton's ``dims`` leave the batch axis out; a model
without a variable first axis gets ``max_batch_size`` 0 and its full shapes."""

from __future__ import annotations

from typing import Any

from edge_node.inference.datatypes import oip_datatype
from edge_node.inference.repository import LoadedModel, ModelRepository
from edge_node.inference.session import batchable
from fleetwire.manifest import TensorSpec

#: OIP datatype → Triton ``data_type`` where the names differ (all others are ``TYPE_`` + the OIP name).
_TRITON_NAMES = {"BYTES": "TYPE_STRING"}


def triton_data_type(numpy_name: str) -> str:
    """Triton's ``data_type`` of a numpy dtype name ("float32" → "TYPE_FP32")."""
    oip = oip_datatype(numpy_name)
    return _TRITON_NAMES.get(oip, f"TYPE_{oip}")


def _tensors(specs: list[TensorSpec], batched: bool) -> list[dict[str, Any]]:
    return [
        {"name": s.name, "data_type": triton_data_type(s.dtype), "dims": s.shape[1:] if batched else s.shape}
        for s in specs
    ]


def triton_config(model: LoadedModel, repository: ModelRepository) -> dict[str, Any]:
    """Triton's model configuration of ``model`` as ``repository`` serves it."""
    batching = repository.batching
    batched = batchable(model.manifest)
    config: dict[str, Any] = {
        "name": model.name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": batching.max_batch_size if batched else 0,
        "input": _tensors(model.manifest.inputs, batched),
        "output": _tensors(model.manifest.outputs, batched),
    }
    if batched and batching.enabled:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": round(batching.max_queue_delay_ms * 1000)}
    return config
