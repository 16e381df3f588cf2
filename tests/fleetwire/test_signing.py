"""Manifest signatures: what central signs, an edge accepts only untouched and only
from the key it pinned; central's key survives a restart."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.signing import KEY_FILE, ManifestSigner
from central.registry.sqlite_impl import SQLiteMetadataStore
from edge_node.sync.trust import ManifestTrust
from fleetwire.convert import manifest_from_pb, manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec
from fleetwire.signing import SignatureError, sign_manifest, verify_manifest


def _manifest() -> Manifest:
    return Manifest(
        name="mlp",
        version="3",
        sha256="a" * 64,
        size=10,
        chunks=[ChunkRef(digest="b" * 64, size=6), ChunkRef(digest="c" * 64, size=4)],
        inputs=[TensorSpec(name="x", dtype="float32", shape=[-1, 64])],
        created_at="2026-01-01T00:00:00.000Z",
        labels={"team": "vision", "stage": "prod"},
        quantization={"method": "dynamic", "agreement": 0.98},
    )


def test_a_signed_manifest_verifies_after_a_trip_through_protobuf() -> None:
    signer = ManifestSigner(Ed25519PrivateKey.generate())
    signed = signer.sign(_manifest())
    verify_manifest(manifest_from_pb(manifest_to_pb(signed)), signer.public_key)


@pytest.mark.parametrize(
    "change",
    [
        {"version": "4"},
        {"chunks": [ChunkRef(digest="d" * 64, size=6), ChunkRef(digest="c" * 64, size=4)]},
        {"sha256": "e" * 64},
        {"labels": {"team": "vision"}},
        {"signature": ""},
    ],
)
def test_a_changed_field_is_refused(change: dict[str, object]) -> None:
    signer = ManifestSigner(Ed25519PrivateKey.generate())
    tampered = signer.sign(_manifest()).model_copy(update=change)
    with pytest.raises(SignatureError):
        verify_manifest(tampered, signer.public_key)


def test_a_signature_by_another_key_is_refused() -> None:
    central = ManifestSigner(Ed25519PrivateKey.generate())
    signed = sign_manifest(_manifest(), Ed25519PrivateKey.generate())
    with pytest.raises(SignatureError, match="does not match key"):
        verify_manifest(signed, central.public_key)


def test_centrals_key_is_private_and_the_same_after_a_restart(tmp_path: Path) -> None:
    first = ManifestSigner.load_or_create(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    again = ManifestSigner.load_or_create(tmp_path)
    assert again.public_key == first.public_key
    verify_manifest(again.sign(_manifest()), first.public_key)


def test_an_edge_pins_the_first_key_and_refuses_another_unless_told_to_repin(tmp_path: Path) -> None:
    first, second = (ManifestSigner(Ed25519PrivateKey.generate()) for _ in range(2))
    assert ManifestTrust(tmp_path).offer(first.public_key)
    restarted = ManifestTrust(tmp_path)  # the pin is on disk
    assert not restarted.offer(second.public_key)
    with pytest.raises(SignatureError):
        restarted.verify(second.sign(_manifest()))
    restarted.verify(first.sign(_manifest()))

    repinning = ManifestTrust(tmp_path, repin=True)
    assert repinning.offer(second.public_key)
    repinning.verify(second.sign(_manifest()))
    assert ManifestTrust(tmp_path).pinned == second.public_key


def test_nothing_verifies_before_a_key_is_pinned(tmp_path: Path) -> None:
    signer = ManifestSigner(Ed25519PrivateKey.generate())
    with pytest.raises(SignatureError, match="no manifest key pinned"):
        ManifestTrust(tmp_path).verify(signer.sign(_manifest()))


def test_versions_stored_before_signing_are_signed_once_at_start_up(tmp_path: Path) -> None:
    store = SQLiteMetadataStore(tmp_path / "registry.sqlite3")
    store.insert_version(_manifest())  # as a registry older than signatures left it
    signer = ManifestSigner.load_or_create(tmp_path)
    assert signer.sign_stored(store) == 1
    record = store.get_version("mlp", "3")
    assert record is not None
    verify_manifest(record.manifest, signer.public_key)
    for artifact in record.artifacts.values():
        verify_manifest(artifact, signer.public_key)
    assert signer.sign_stored(store) == 0
    store.close()
