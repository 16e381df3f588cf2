"""The edge's own form of a desired state, converted from protobuf at the stream."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetwire.convert import manifest_from_pb
from fleetwire.manifest import ArtifactRef, Manifest
from fleetwire.v1 import registry_pb2


@dataclass(frozen=True)
class DesiredVersion:
    """A version to hold (and serve, unless ``serve`` is False) with its chunk owners."""

    manifest: Manifest
    serve: bool
    placement: dict[str, list[str]]


@dataclass(frozen=True)
class EdgeDesiredState:
    """What central wants this node to hold, and where its peers are."""

    generation: int
    versions: list[DesiredVersion]
    peers: dict[str, str] = field(default_factory=dict)
    placement_enabled: bool = True

    def owners(self) -> dict[str, list[str]]:
        """digest → owners across all versions (first version wins on overlap)."""
        owners: dict[str, list[str]] = {}
        for v in self.versions:
            for digest, o in v.placement.items():
                owners.setdefault(digest, o)
        return owners

    def chunk_sizes(self) -> dict[str, int]:
        """digest → size across the manifests of all versions: every file of every artifact
        (a node may own, seed and relay any of them)."""
        return {c.digest: c.size for v in self.versions for c in v.manifest.unique_chunks()}


def artifact_to_serve(manifest: Manifest) -> ArtifactRef:
    """The artifact this node assembles and serves for ``manifest``: its default one."""
    return manifest.served()


def served_digests(versions: Iterable[DesiredVersion]) -> set[str]:
    """Every chunk of every file of the artifact each served version assembles (what the
    cache pins besides owned chunks)."""
    return {c.digest for v in versions if v.serve for c in artifact_to_serve(v.manifest).all_chunks()}


def chunk_bytes(artifact: ArtifactRef) -> int:
    """Bytes of the artifact's unique chunks: what the cache must hold to assemble it."""
    return sum(c.size for c in artifact.all_chunks())


def state_from_pb(pb: registry_pb2.DesiredState) -> EdgeDesiredState:
    """Convert a stream message."""
    return EdgeDesiredState(
        generation=pb.generation,
        versions=[
            DesiredVersion(
                manifest=manifest_from_pb(v.manifest),
                serve=v.serve,
                placement={p.digest: list(p.owners) for p in v.placement},
            )
            for v in pb.versions
        ],
        peers={p.node_id: p.grpc_address for p in pb.peers},
        placement_enabled=pb.placement_enabled,
    )
