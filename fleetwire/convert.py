"""Manifest, key endorsements and runtime limits ↔ protobuf. Both deployables convert at
their transport edge with these, so core logic never handles ``_pb2`` classes."""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleetwire.manifest import KIND_TENSOR, ArtifactRef, ChunkRef, FileRef, Manifest, TensorSpec
from fleetwire.runtime_limits import RuntimeLimits
from fleetwire.signing import KeyEndorsement
from fleetwire.v1 import common_pb2, registry_pb2


def _spec_to_pb(spec: TensorSpec) -> common_pb2.TensorSpec:
    return common_pb2.TensorSpec(name=spec.name, dtype=spec.dtype, shape=spec.shape)


def _spec_from_pb(pb: common_pb2.TensorSpec) -> TensorSpec:
    return TensorSpec(name=pb.name, dtype=pb.dtype, shape=list(pb.shape))


def _chunks_to_pb(chunks: list[ChunkRef]) -> list[common_pb2.ChunkRef]:
    return [common_pb2.ChunkRef(digest=c.digest, size=c.size) for c in chunks]


def _chunks_from_pb(pbs: Iterable[common_pb2.ChunkRef]) -> list[ChunkRef]:
    return [ChunkRef(digest=c.digest, size=c.size) for c in pbs]


def _file_to_pb(f: FileRef) -> common_pb2.FileRef:
    return common_pb2.FileRef(path=f.path, sha256=f.sha256, size=f.size, chunks=_chunks_to_pb(f.chunks))


def _file_from_pb(pb: common_pb2.FileRef) -> FileRef:
    return FileRef(path=pb.path, sha256=pb.sha256, size=pb.size, chunks=_chunks_from_pb(pb.chunks))


def _json_or_empty(value: dict[str, object] | None) -> str:
    return json.dumps(value) if value is not None else ""


def _artifact_to_pb(a: ArtifactRef) -> common_pb2.ArtifactRef:
    return common_pb2.ArtifactRef(
        artifact=a.artifact,
        sha256=a.sha256,
        size=a.size,
        chunks=_chunks_to_pb(a.chunks),
        files=[_file_to_pb(f) for f in a.files],
        quantization_json=_json_or_empty(a.quantization),
    )


def _artifact_from_pb(pb: common_pb2.ArtifactRef) -> ArtifactRef:
    return ArtifactRef(
        artifact=pb.artifact,
        sha256=pb.sha256,
        size=pb.size,
        chunks=_chunks_from_pb(pb.chunks),
        files=[_file_from_pb(f) for f in pb.files],
        quantization=json.loads(pb.quantization_json) if pb.quantization_json else None,
    )


def manifest_to_pb(m: Manifest) -> common_pb2.Manifest:
    """The protobuf form of ``m``."""
    return common_pb2.Manifest(
        name=m.name,
        version=m.version,
        sha256=m.sha256,
        size=m.size,
        chunks=_chunks_to_pb(m.chunks),
        inputs=[_spec_to_pb(s) for s in m.inputs],
        outputs=[_spec_to_pb(s) for s in m.outputs],
        created_at=m.created_at,
        labels=m.labels,
        artifact=m.artifact,
        quantization_json=_json_or_empty(m.quantization),
        signature=bytes.fromhex(m.signature),
        files=[_file_to_pb(f) for f in m.files],
        alternatives=[_artifact_to_pb(a) for a in m.alternatives],
        pending=[_artifact_to_pb(a) for a in m.pending],
        kind="" if m.kind == KIND_TENSOR else m.kind,
    )


def manifest_from_pb(pb: common_pb2.Manifest) -> Manifest:
    """The model form of a protobuf manifest."""
    return Manifest(
        name=pb.name,
        version=pb.version,
        sha256=pb.sha256,
        size=pb.size,
        chunks=_chunks_from_pb(pb.chunks),
        inputs=[_spec_from_pb(s) for s in pb.inputs],
        outputs=[_spec_from_pb(s) for s in pb.outputs],
        created_at=pb.created_at,
        labels=dict(pb.labels),
        artifact=pb.artifact or "fp32",
        quantization=json.loads(pb.quantization_json) if pb.quantization_json else None,
        signature=pb.signature.hex(),
        files=[_file_from_pb(f) for f in pb.files],
        alternatives=[_artifact_from_pb(a) for a in pb.alternatives],
        pending=[_artifact_from_pb(a) for a in pb.pending],
        kind=pb.kind or KIND_TENSOR,
    )


def endorsements_to_pb(chain: list[KeyEndorsement]) -> list[registry_pb2.KeyEndorsement]:
    """The protobuf form of a manifest key's endorsement chain (RegisterReply)."""
    return [
        registry_pb2.KeyEndorsement(
            old_public_key=e.old_public_key,
            new_public_key=e.new_public_key,
            created_at=e.created_at,
            signature=e.signature,
        )
        for e in chain
    ]


def endorsements_from_pb(pbs: Iterable[registry_pb2.KeyEndorsement]) -> list[KeyEndorsement]:
    """The model form of a RegisterReply's endorsement chain."""
    return [KeyEndorsement(pb.old_public_key, pb.new_public_key, pb.created_at, pb.signature) for pb in pbs]


def register_request(node: registry_pb2.NodeInfo, runtime: RuntimeLimits | None) -> registry_pb2.RegisterRequest:
    """An edge's registration: its node and (when known) what its ONNX Runtime loads."""
    if runtime is None:
        return registry_pb2.RegisterRequest(node=node)
    return registry_pb2.RegisterRequest(
        node=node,
        runtime=runtime.runtime,
        max_ir_version=runtime.max_ir_version,
        max_opsets=dict(runtime.max_opsets),
    )


def runtime_from_pb(pb: registry_pb2.RegisterRequest) -> RuntimeLimits | None:
    """What a registration says the node's runtime loads; None from an edge that does not say."""
    if not pb.runtime or pb.max_ir_version == 0:
        return None
    opsets = {("" if domain == "ai.onnx" else domain): int(v) for domain, v in pb.max_opsets.items()}
    return RuntimeLimits(runtime=pb.runtime, max_ir_version=int(pb.max_ir_version), max_opsets=opsets)
