"""KServe v2 gRPC inference (``inference.GRPCInferenceService``) over the edge's data plane.

``servicer.InferenceServicer`` is the transport; ``converters`` turn protobuf messages into
the plane's types and back, so nothing past them sees a ``_pb2`` class. The Peer service
(chunks for other edges) is ``edge_node.peer``: a different job that also speaks gRPC."""

from __future__ import annotations

from edge_node.grpc.servicer import InferenceServicer

__all__ = ["InferenceServicer"]
