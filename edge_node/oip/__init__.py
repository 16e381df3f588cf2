"""The Open Inference Protocol v2 (KServe / Triton / MLServer) over HTTP."""

from __future__ import annotations

from edge_node.oip.codec import InferRequest, OipError, decode_request, encode_response
from edge_node.oip.dataplane import DataPlane, OipLimits, PlaneError
from edge_node.oip.routes import create_oip_router, create_oip_routes

__all__ = [
    "DataPlane",
    "InferRequest",
    "OipError",
    "OipLimits",
    "PlaneError",
    "create_oip_router",
    "create_oip_routes",
    "decode_request",
    "encode_response",
]
