"""A version's manifest re-issued when its pending INT8 is decided: promoted, the candidate is
the default artifact with FP32 among the alternatives; rejected, it leaves ``pending``. Both
verify with central's key, and an edge's ``served_as`` copy of the promoted manifest rebuilds
the signed form (what a copy on disk is checked with)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.pending import promoted_manifest, rejected_manifest
from central.registry.signing import ManifestSigner
from edge_node.sync.chooser import served_as, signed_form
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.signing import verify_manifest

INT8 = "int8-s8s8-qdq"


def _pushed() -> tuple[Manifest, Manifest]:
    """The served FP32 manifest with INT8 pending, and the candidate's own manifest."""
    report = {"int8": {"status": "unproven", "reason": "16 samples cannot prove more", "pending": [INT8]},
              "served": "fp32", "threshold": 0.97, "confidence": 0.95}  # fmt: skip
    int8 = ArtifactRef(
        artifact=INT8, sha256="b" * 64, size=2, chunks=[ChunkRef(digest="b" * 64, size=2)],
        quantization={"guard": {"threshold": 0.97, "confidence": 0.95}},
    )  # fmt: skip
    fp32 = Manifest(
        name="m", version="1", sha256="a" * 64, size=4, chunks=[ChunkRef(digest="a" * 64, size=4)],
        created_at="2026-12-05T00:00:00Z", quantization=report, pending=[int8], labels={"team": "a"},
    )  # fmt: skip
    candidate = Manifest(
        name="m", version="1", sha256=int8.sha256, size=int8.size, chunks=int8.chunks, artifact=INT8,
        created_at="2026-12-05T00:00:00Z", quantization=report,
    )  # fmt: skip
    return fp32, candidate


def test_a_promoted_manifest_serves_the_candidate_and_keeps_fp32() -> None:
    signer = ManifestSigner(Ed25519PrivateKey.generate())
    fp32, candidate = _pushed()
    evidence = {"measures": {"top1": {"value": 1.0, "lower_bound": 0.971, "samples": 320}}, "nodes": 1}
    promoted = signer.sign(promoted_manifest(signer.sign(fp32), candidate, evidence))
    verify_manifest(promoted, signer.public_key)
    assert promoted.artifact == INT8 and promoted.pending == [] and promoted.labels == {"team": "a"}
    assert [a.artifact for a in promoted.alternatives] == ["fp32"] and promoted.alternatives[0].sha256 == "a" * 64
    int8 = promoted.quantization["int8"] if promoted.quantization else {}
    assert int8["status"] == "promoted" and int8["promoted"]["nodes"] == 1 and int8["pending"] == []
    assert int8["reason"] is None and promoted.quantization and promoted.quantization["served"] == INT8
    # An edge that times FP32 faster serves a copy whose signed form is the promoted manifest.
    copy = served_as(promoted, "fp32")
    assert copy.artifact == "fp32" and signed_form(copy) == promoted


def test_a_rejected_candidate_leaves_fp32_served_and_nothing_pending() -> None:
    signer = ManifestSigner(Ed25519PrivateKey.generate())
    fp32, _ = _pushed()
    rejected = signer.sign(rejected_manifest(fp32, INT8, {"reason": "top-1 agreement 0.5", "nodes": 2}))
    verify_manifest(rejected, signer.public_key)
    assert rejected.artifact == "fp32" and rejected.pending == [] and rejected.alternatives == []
    assert rejected.quantization and rejected.quantization["int8"]["status"] == "rejected"
    assert rejected.artifact_named(INT8) is None
