"""The data plane's inference request: what every transport decodes its wire format into.

REST (``edge_node.rest.codec``) and KServe gRPC (``edge_node.grpc.converters``) each build
one; the plane and the model see numpy arrays only, never JSON or protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["InferRequest"]


@dataclass
class InferRequest:
    """A decoded inference request. ``binary_outputs``/``binary_default`` say which outputs
    REST writes as binary tensor data (gRPC always answers raw bytes)."""

    id: str | None
    inputs: dict[str, np.ndarray]
    requested_outputs: list[str] | None
    binary_outputs: set[str] = field(default_factory=set)
    binary_default: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
