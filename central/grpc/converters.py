"""protobuf ↔ central's own types, at the edge of the gRPC servicer."""

from __future__ import annotations

from central.distribution import ArtifactVerdict, DesiredState
from central.membership import NodeRecord
from fleetwire.convert import manifest_to_pb, runtime_from_pb
from fleetwire.transfer import DEFAULT_SITE, caps_to_pb, site_or_default
from fleetwire.v1 import registry_pb2


def node_from_pb(request: registry_pb2.RegisterRequest) -> NodeRecord:
    """A registration request's node, with what its runtime loads."""
    pb = request.node
    return NodeRecord(
        node_id=pb.node_id,
        grpc_address=pb.grpc_address,
        http_address=pb.http_address,
        capacity=max(1, pb.capacity),
        labels=dict(pb.labels),
        hardware_class=pb.hardware_class,
        site=site_or_default(pb.site),
        runtime=runtime_from_pb(request),
    )


def _verdict_to_pb(v: ArtifactVerdict | None) -> registry_pb2.ArtifactVerdict | None:
    if v is None:
        return None
    return registry_pb2.ArtifactVerdict(
        artifact=v.artifact,
        hardware_class=v.hardware_class,
        node_id=v.node_id,
        speedup_b1=v.speedup_b1,
        speedup_b8=v.speedup_b8,
    )


def desired_state_to_pb(state: DesiredState) -> registry_pb2.DesiredState:
    """A desired state for the watch stream."""
    return registry_pb2.DesiredState(
        generation=state.generation,
        versions=[
            registry_pb2.VersionAssignment(
                manifest=manifest_to_pb(v.manifest),
                serve=v.serve,
                placement=[registry_pb2.ChunkPlacement(digest=d, owners=owners) for d, owners in v.placement.items()],
                verdict=_verdict_to_pb(v.verdict),
                stage=v.stage,
                serve_at_ms=round(v.serve_at * 1000) if v.serve_at is not None else 0,
                force_artifact=v.force_artifact or "",
            )
            for v in state.versions
        ],
        peers=[
            registry_pb2.PeerAddress(node_id=k, grpc_address=a, site=state.peer_sites.get(k, DEFAULT_SITE))
            for k, a in sorted(state.peers.items())
        ],
        placement_enabled=state.placement_enabled,
        limits=caps_to_pb(state.limits),
    )
