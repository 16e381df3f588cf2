"""The wire contract shared by central and the edges.

Generated gRPC stubs (``fleetwire.v1``), chunk digests, the manifest model and the
name rules. Nothing here knows about servers: both deployables import it, neither
imports the other.
"""

from __future__ import annotations

from fleetwire.digest import CHUNK_PIECE_BYTES, PEER_PIECE_BYTES, chunk_digest, is_digest, sha256_file
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec
from fleetwire.names import NAME_PATTERN, InvalidName, check_name

__all__ = [
    "CHUNK_PIECE_BYTES",
    "NAME_PATTERN",
    "PEER_PIECE_BYTES",
    "ChunkRef",
    "InvalidName",
    "Manifest",
    "TensorSpec",
    "check_name",
    "chunk_digest",
    "is_digest",
    "sha256_file",
]
