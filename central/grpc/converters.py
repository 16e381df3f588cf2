"""protobuf ↔ central's own types, at the edge of the gRPC servicer.

A fleet-wide change builds every node's ``DesiredState`` message, and every node's holds
the same few manifests: converting each manifest again per node (chunk by chunk, in
Python) was most of the ~0.45 s a change cost at 10,000 nodes (``bench._ha_seal``,
``build_s_per_change``). A signed manifest never changes (its signature covers every other
field; a re-issue is signed anew), so its message is converted once, kept by signature,
and copied into each node's message (``CopyFrom`` in upb: cheaper than parsing its bytes,
and far cheaper than handing it to a constructor, which copies through Python)."""

from __future__ import annotations

import functools

from central.distribution import ArtifactVerdict, DesiredState
from central.membership import NodeRecord
from fleetwire.convert import manifest_to_pb, runtime_from_pb
from fleetwire.manifest import Manifest
from fleetwire.transfer import DEFAULT_SITE, caps_to_pb, site_or_default
from fleetwire.v1 import common_pb2, registry_pb2

#: Signed manifests' messages, by signature (hex); never handed out, only copied from.
_MANIFEST_PBS: dict[str, common_pb2.Manifest] = {}
#: Entries before the cache starts over (bounds memory under version churn; a fleet's
#: states hold a few dozen manifests).
MANIFEST_CACHE_ENTRIES = 1024


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


@functools.lru_cache(maxsize=4096)
def _verdict_pb(v: ArtifactVerdict) -> registry_pb2.ArtifactVerdict:
    """A verdict's message, shared (copied from, never changed): one per hardware class is
    in every node's state of that class."""
    return registry_pb2.ArtifactVerdict(
        artifact=v.artifact,
        hardware_class=v.hardware_class,
        node_id=v.node_id,
        speedup_b1=v.speedup_b1,
        speedup_b8=v.speedup_b8,
    )


def manifest_pb_of(m: Manifest) -> common_pb2.Manifest:
    """``manifest_to_pb(m)``, converted once per signed manifest: a shared message that
    callers copy from (``CopyFrom``) and never change. An unsigned manifest is converted
    each time (nothing vouches that its name and version mean the same content)."""
    if not m.signature:
        return manifest_to_pb(m)
    cached = _MANIFEST_PBS.get(m.signature)
    if cached is None:
        if len(_MANIFEST_PBS) >= MANIFEST_CACHE_ENTRIES:
            _MANIFEST_PBS.clear()
        cached = _MANIFEST_PBS[m.signature] = manifest_to_pb(m)
    return cached


def desired_state_to_pb(state: DesiredState) -> registry_pb2.DesiredState:
    """A desired state for the watch stream. Submessages are added in place (``add``,
    ``CopyFrom``): a message handed to a constructor is copied once more."""
    pb = registry_pb2.DesiredState(
        generation=state.generation, placement_enabled=state.placement_enabled, limits=caps_to_pb(state.limits)
    )
    for v in state.versions:
        version = pb.versions.add(
            serve=v.serve,
            stage=v.stage,
            serve_at_ms=round(v.serve_at * 1000) if v.serve_at is not None else 0,
            force_artifact=v.force_artifact or "",
        )
        version.manifest.CopyFrom(manifest_pb_of(v.manifest))
        if v.verdict is not None:
            version.verdict.CopyFrom(_verdict_pb(v.verdict))
        for digest, owners in v.placement.items():
            version.placement.add(digest=digest, owners=owners)
    for node_id, address in sorted(state.peers.items()):
        pb.peers.add(node_id=node_id, grpc_address=address, site=state.peer_sites.get(node_id, DEFAULT_SITE))
    return pb
