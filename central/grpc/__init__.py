"""Central's gRPC transport: the Registry servicer for edges, the gateway's KServe v2
servicer, protobuf converters, the status half of the error map and the listeners."""

from __future__ import annotations

__all__: list[str] = []
