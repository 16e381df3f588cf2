"""Desired states sealed as central seals them, for edge tests without a central."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fleetwire.convert import manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.sealing import seal_state
from fleetwire.signing import sign_manifest
from fleetwire.v1 import registry_pb2

#: The key ``sealed_state`` seals with by default.
SEAL_KEY = Ed25519PrivateKey.generate()


def sealed_state(
    generation: int = 7, node_id: str = "edge-1", key: Ed25519PrivateKey = SEAL_KEY, serve: bool = True
) -> registry_pb2.DesiredState:
    """A desired state of one signed manifest, sealed for ``node_id`` as central seals it."""
    manifest = Manifest(
        name="mlp",
        version="1",
        sha256="ab" * 32,
        size=4,
        chunks=[ChunkRef(digest="cd" * 32, size=4, offset=0)],
        created_at="2026-12-03T00:00:00Z",
    )
    state = registry_pb2.DesiredState(
        generation=generation,
        versions=[registry_pb2.VersionAssignment(manifest=manifest_to_pb(sign_manifest(manifest, key)), serve=serve)],
        limits=registry_pb2.TransferLimits(serve_bytes_per_s=1000),
        placement_enabled=True,
    )
    seal_state(state, node_id, 1_765_000_000_000, key.sign)
    return state
