"""Manifests with external-data files and alternative artifacts: schema, protobuf, signing."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from fleetwire.convert import manifest_from_pb, manifest_to_pb
from fleetwire.manifest import ArtifactRef, ChunkRef, FileRef, Manifest
from fleetwire.signing import SignatureError, raw_public_key, sign_manifest, verify_manifest


def _chunk(tag: str, size: int = 10) -> ChunkRef:
    return ChunkRef(digest=tag * 64, size=size)


def _manifest(**extra: object) -> Manifest:
    fields: dict[str, object] = {
        "name": "m",
        "version": "v1",
        "sha256": "a" * 64,
        "size": 20,
        "chunks": [_chunk("a"), _chunk("b")],
        "created_at": "2026-12-03T00:00:00Z",
        "artifact": "int8-u8s8-qdq",
    }
    return Manifest.model_validate({**fields, **extra})


def _with_everything() -> Manifest:
    data = FileRef(path="model.onnx.data", sha256="c" * 64, size=30, chunks=[_chunk("c", 20), _chunk("b")])
    fp32 = ArtifactRef(artifact="fp32", sha256="d" * 64, size=5, chunks=[_chunk("d", 5)], files=[data])
    return _manifest(files=[data], alternatives=[fp32])


def test_artifacts_lists_the_served_one_first_and_chunks_dedupe_across_files() -> None:
    m = _with_everything()
    assert [a.artifact for a in m.artifacts()] == ["int8-u8s8-qdq", "fp32"]
    assert [c.digest[0] for c in m.served().all_chunks()] == ["a", "b", "c"]
    assert [c.digest[0] for c in m.unique_chunks()] == ["a", "b", "c", "d"]
    assert m.artifact_named("fp32") is not None and m.artifact_named("fp32").total_size == 35  # type: ignore[union-attr]
    assert m.artifact_named("int8-s8s8-qdq") is None


def test_protobuf_round_trip_keeps_files_and_alternatives() -> None:
    m = _with_everything()
    assert manifest_from_pb(manifest_to_pb(m)) == m


@pytest.mark.parametrize("path", ["../x", "a/b", ".hidden", "model.onnx", "", "x\n", "a" * 300])
def test_a_data_file_name_that_could_escape_the_version_directory_is_refused(path: str) -> None:
    with pytest.raises(ValidationError):
        FileRef(path=path, sha256="c" * 64, size=1, chunks=[])


def test_signature_covers_files_and_alternatives() -> None:
    key = Ed25519PrivateKey.generate()
    signed = sign_manifest(_with_everything(), key)
    verify_manifest(signed, raw_public_key(key))
    swapped = signed.model_copy(update={"alternatives": []})
    with pytest.raises(SignatureError):
        verify_manifest(swapped, raw_public_key(key))


def test_a_manifest_signed_before_files_existed_still_verifies() -> None:
    """Empty new fields are left out of the signed bytes, so old signatures hold."""
    key = Ed25519PrivateKey.generate()
    plain = _manifest()
    old_bytes = plain.model_dump_json(exclude={"signature", "files", "alternatives", "pending", "kind"})
    canonical = json.dumps(json.loads(old_bytes), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    signature = key.sign(canonical.encode()).hex()
    verify_manifest(plain.model_copy(update={"signature": signature}), raw_public_key(key))


def test_a_language_model_manifest_keeps_its_kind_through_protobuf_and_under_its_signature() -> None:
    key = Ed25519PrivateKey.generate()
    tokenizer = FileRef(path="tokenizer.json", sha256="e" * 64, size=10, chunks=[_chunk("e")])
    decoder = sign_manifest(_manifest(kind="decoder", files=[tokenizer]), key)
    assert decoder.is_language_model and not _manifest().is_language_model
    back = manifest_from_pb(manifest_to_pb(decoder))
    assert back == decoder and back.kind == "decoder"
    verify_manifest(back, raw_public_key(key))
    with pytest.raises(SignatureError):  # the kind is signed: an edge cannot be told a decoder is a tensor model
        verify_manifest(decoder.model_copy(update={"kind": "tensor"}), raw_public_key(key))
    assert manifest_from_pb(manifest_to_pb(_manifest())).kind == "tensor"
