"""The Open Inference Protocol v2 (KServe / Triton / MLServer) over HTTP."""

from __future__ import annotations

from edge_node.oip.codec import InferRequest, OipError, decode_request, encode_response
from edge_node.oip.routes import OipLimits, create_oip_router

__all__ = ["InferRequest", "OipError", "OipLimits", "create_oip_router", "decode_request", "encode_response"]
