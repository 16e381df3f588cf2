"""OIP v2 JSON documents (what the REST transports answer) as KServe v2 gRPC messages, for
the edge's servicer and central's gateway alike."""

from __future__ import annotations

from typing import Any

from fleetwire.kserve import grpc_predict_v2_pb2 as pb

__all__ = ["model_metadata_to_pb", "server_metadata_to_pb"]


def model_metadata_to_pb(doc: dict[str, Any]) -> pb.ModelMetadataResponse:
    """A model metadata document (``name``, ``versions``, ``platform``, ``inputs``, ``outputs``)."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=doc["name"],
        versions=doc.get("versions", []),
        platform=doc.get("platform", ""),
        inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in doc.get("inputs", [])],
        outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in doc.get("outputs", [])],
    )


def server_metadata_to_pb(doc: dict[str, Any]) -> pb.ServerMetadataResponse:
    """A server metadata document (``name``, ``version``, ``extensions``)."""
    return pb.ServerMetadataResponse(name=doc["name"], version=doc["version"], extensions=doc["extensions"])
