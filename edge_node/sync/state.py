"""The edge's own form of a desired state, converted from protobuf at the stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwire.convert import manifest_from_pb
from fleetwire.manifest import Manifest
from fleetwire.transfer import TransferCaps, caps_from_pb, site_or_default
from fleetwire.v1 import registry_pb2


@dataclass(frozen=True)
class SharedVerdict:
    """Which artifact of a version the first node of this node's hardware class chose."""

    artifact: str
    hardware_class: str
    node_id: str
    speedup_b1: float | None = None
    speedup_b8: float | None = None


@dataclass(frozen=True)
class DesiredVersion:
    """A version to hold (and serve, unless ``serve`` is False) with its chunk owners."""

    manifest: Manifest
    serve: bool
    placement: dict[str, list[str]]
    #: Central's verdict for this node's class; None: time the artifacts here.
    verdict: SharedVerdict | None = None
    #: Not served, but fetched, verified and assembled whole (a staged rollout before its flip).
    stage: bool = False
    #: Served from this instant of central's clock (Unix seconds); None: at once.
    serve_at: float | None = None

    @property
    def held(self) -> bool:
        """Whether this node assembles the version (served or staged), not only seeds its chunks."""
        return self.serve or self.stage

    #: Serve this artifact whatever the pin, the verdict or timing say (central's fallback of
    #: INT8 to FP32 when they disagree on live traffic); None: no override.
    force_artifact: str | None = None


@dataclass(frozen=True)
class EdgeDesiredState:
    """What central wants this node to hold, and where its peers are."""

    generation: int
    versions: list[DesiredVersion]
    peers: dict[str, str] = field(default_factory=dict)
    placement_enabled: bool = True
    #: node id → site of every peer.
    peer_sites: dict[str, str] = field(default_factory=dict)
    #: Central's caps for this node (unset ones: its own settings).
    limits: TransferCaps = field(default_factory=TransferCaps)

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


def _verdict_from_pb(pb: registry_pb2.VersionAssignment) -> SharedVerdict | None:
    if not pb.HasField("verdict") or not pb.verdict.artifact:
        return None
    v = pb.verdict
    return SharedVerdict(
        artifact=v.artifact,
        hardware_class=v.hardware_class,
        node_id=v.node_id,
        speedup_b1=v.speedup_b1 if v.HasField("speedup_b1") else None,
        speedup_b8=v.speedup_b8 if v.HasField("speedup_b8") else None,
    )


def state_from_pb(pb: registry_pb2.DesiredState) -> EdgeDesiredState:
    """Convert a stream message."""
    return EdgeDesiredState(
        generation=pb.generation,
        versions=[
            DesiredVersion(
                manifest=manifest_from_pb(v.manifest),
                serve=v.serve,
                placement={p.digest: list(p.owners) for p in v.placement},
                verdict=_verdict_from_pb(v),
                stage=v.stage and not v.serve,
                serve_at=v.serve_at_ms / 1000 if v.serve and v.serve_at_ms else None,
                force_artifact=v.force_artifact or None,
            )
            for v in pb.versions
        ],
        peers={p.node_id: p.grpc_address for p in pb.peers},
        placement_enabled=pb.placement_enabled,
        peer_sites={p.node_id: site_or_default(p.site) for p in pb.peers},
        limits=caps_from_pb(pb.limits),
    )
