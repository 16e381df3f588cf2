"""Desired states sealed as central seals them, for edge tests without a central."""

from __future__ import annotations

from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fleetwire.convert import manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.sealing import seal_state, seal_states
from fleetwire.signing import sign_manifest
from fleetwire.v1 import registry_pb2

#: The key ``sealed_state`` seals with by default.
SEAL_KEY = Ed25519PrivateKey.generate()
#: ``issued_at_ms`` of every seal made here.
ISSUED_AT_MS = 1_765_000_000_000

SealForm = Literal["tree", "single"]


def unsealed_state(
    generation: int = 7, key: Ed25519PrivateKey = SEAL_KEY, serve: bool = True
) -> registry_pb2.DesiredState:
    """A desired state of one signed manifest, not sealed yet."""
    manifest = Manifest(
        name="mlp",
        version="1",
        sha256="ab" * 32,
        size=4,
        chunks=[ChunkRef(digest="cd" * 32, size=4, offset=0)],
        created_at="2026-12-03T00:00:00Z",
    )
    return registry_pb2.DesiredState(
        generation=generation,
        versions=[registry_pb2.VersionAssignment(manifest=manifest_to_pb(sign_manifest(manifest, key)), serve=serve)],
        limits=registry_pb2.TransferLimits(serve_bytes_per_s=1000),
        placement_enabled=True,
    )


def sealed_state(
    generation: int = 7,
    node_id: str = "edge-1",
    key: Ed25519PrivateKey = SEAL_KEY,
    serve: bool = True,
    form: SealForm = "tree",
) -> registry_pb2.DesiredState:
    """A desired state of one signed manifest sealed for ``node_id``: in the tree form central
    sends now (a leaf of a tree of three, ``node_id``'s in the middle), or the single form
    (one signature of its own) that older centrals sent."""
    state = unsealed_state(generation, key, serve)
    if form == "single":
        seal_state(state, node_id, ISSUED_AT_MS, key.sign)
    else:
        others = [unsealed_state(generation, key, serve) for _ in range(2)]
        seal_states([(others[0], "other-a"), (state, node_id), (others[1], "other-b")], ISSUED_AT_MS, key.sign)
    return state


def sealed_together(
    node_ids: list[str], generation: int = 7, key: Ed25519PrivateKey = SEAL_KEY
) -> dict[str, registry_pb2.DesiredState]:
    """One state per node, all sealed under one signature (a fleet-wide change)."""
    states = {n: unsealed_state(generation, key) for n in node_ids}
    seal_states([(s, n) for n, s in states.items()], ISSUED_AT_MS, key.sign)
    return states
