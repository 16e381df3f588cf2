"""The Peer gRPC service: other edges fetch chunks this node owns."""

from __future__ import annotations

from edge_node.peer.servicer import PeerServicer

__all__ = ["PeerServicer"]
