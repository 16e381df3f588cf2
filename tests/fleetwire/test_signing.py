"""Manifest signatures: what central signs, an edge accepts only untouched and only
from the key it pinned; central's key survives a restart."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from central.registry.signing import (
    ENDORSEMENTS_FILE,
    KEY_FILE,
    RETIRED_DIR,
    KeyRotationError,
    ManifestSigner,
    rotate_key,
)
from central.storage.sqlite.registry import SQLiteMetadataStore
from edge_node.sync.trust import ManifestTrust
from fleetwire.convert import endorsements_from_pb, endorsements_to_pb, manifest_from_pb, manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest, TensorSpec
from fleetwire.signing import (
    KeyEndorsement,
    SignatureError,
    endorse,
    sign_manifest,
    verify_chain,
    verify_manifest,
)


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


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def _load_pem(path: Path) -> Ed25519PrivateKey:
    key = load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def _keys(n: int) -> list[Ed25519PrivateKey]:
    return [Ed25519PrivateKey.generate() for _ in range(n)]


def _raw(key: Ed25519PrivateKey) -> bytes:
    return ManifestSigner(key).public_key


def _chain(keys: list[Ed25519PrivateKey]) -> list[KeyEndorsement]:
    """k0 -> k1 -> … each endorsed by its predecessor, as successive rotations make it."""
    return [endorse(old, _raw(new), f"2026-0{i + 1}-01T00:00:00Z") for i, (old, new) in enumerate(pairwise(keys))]


def test_a_chain_of_endorsements_leads_from_any_earlier_key_to_the_current_one() -> None:
    keys = _keys(4)
    chain = _chain(keys)
    assert verify_chain(_raw(keys[0]), _raw(keys[3]), chain) == 3
    assert verify_chain(_raw(keys[2]), _raw(keys[3]), chain) == 1
    # through protobuf, as edges receive it in RegisterReply
    assert verify_chain(_raw(keys[0]), _raw(keys[3]), endorsements_from_pb(endorsements_to_pb(chain))) == 3


@pytest.mark.parametrize(
    "break_link",
    [
        lambda e, other: replace(e, new_public_key=other),  # a key swapped in after signing
        lambda e, other: replace(e, created_at="2027-01-01T00:00:00Z"),
        lambda e, other: replace(e, signature=bytes(64)),
        lambda e, other: replace(e, new_public_key=b"short"),
    ],
)
def test_a_broken_link_is_refused(break_link: Callable[[KeyEndorsement, bytes], KeyEndorsement]) -> None:
    keys = _keys(3)
    chain = _chain(keys)
    chain[0] = break_link(chain[0], _raw(Ed25519PrivateKey.generate()))
    with pytest.raises(SignatureError):
        verify_chain(_raw(keys[0]), _raw(keys[2]), chain)


def test_a_chain_from_an_unrelated_key_is_refused() -> None:
    pinned, *attacker = _keys(3)  # a well-formed chain, but not from the pinned key
    with pytest.raises(SignatureError, match="signed by the pinned key"):
        verify_chain(_raw(pinned), _raw(attacker[1]), _chain(attacker))
    with pytest.raises(SignatureError, match="no endorsement leads"):
        verify_chain(_raw(pinned), _raw(attacker[1]), [])


def test_a_reordered_spliced_or_backwards_chain_is_refused() -> None:
    keys = _keys(4)
    chain = _chain(keys)
    for pinned in (keys[0], keys[1]):
        with pytest.raises(SignatureError, match="does not continue"):
            verify_chain(_raw(pinned), _raw(keys[3]), [chain[1], chain[0], chain[2]])
    with pytest.raises(SignatureError, match="does not continue"):  # a link left out
        verify_chain(_raw(keys[0]), _raw(keys[3]), [chain[0], chain[2]])
    with pytest.raises(SignatureError, match="ends at key"):  # no way back to an older key
        verify_chain(_raw(keys[3]), _raw(keys[1]), chain)


def test_an_edge_re_pins_along_the_chain_and_refuses_an_unendorsed_key(tmp_path: Path) -> None:
    keys = _keys(3)
    chain = _chain(keys)
    trust = ManifestTrust(tmp_path)
    assert trust.offer(_raw(keys[0]))
    assert not trust.offer(_raw(keys[2]), chain[1:])  # the link from the pinned key is missing
    assert trust.pinned == _raw(keys[0])
    assert trust.offer(_raw(keys[2]), chain)
    assert ManifestTrust(tmp_path).pinned == _raw(keys[2])  # re-pinned on disk
    trust.verify(ManifestSigner(keys[2]).sign(_manifest()))
    with pytest.raises(SignatureError):  # the old key signs nothing any more
        trust.verify(ManifestSigner(keys[0]).sign(_manifest()))
    assert not trust.offer(_raw(keys[0]), chain)  # nor comes back


def test_rotation_endorses_the_new_key_and_central_re_signs_stored_versions(tmp_path: Path) -> None:
    store = SQLiteMetadataStore(tmp_path / "registry.sqlite3")
    first = ManifestSigner.load_or_create(tmp_path)
    store.insert_version(first.sign(_manifest()))
    rotate_key(tmp_path)
    rotate_key(tmp_path)
    third = ManifestSigner.load_or_create(tmp_path)
    assert len(third.endorsements) == 2
    assert verify_chain(first.public_key, third.public_key, third.endorsements) == 2
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    retired = sorted((tmp_path / RETIRED_DIR).iterdir())
    assert len(retired) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in retired)
    assert third.sign_stored(store) == 1
    record = store.get_version("mlp", "3")
    assert record is not None
    verify_manifest(record.manifest, third.public_key)
    assert third.sign_stored(store) == 0
    store.close()


def test_a_rotation_interrupted_by_a_crash_is_finished_or_dropped_at_start_up(tmp_path: Path) -> None:
    old = ManifestSigner.load_or_create(tmp_path)
    (tmp_path / "manifest-signing.key.next").write_bytes(_pem(Ed25519PrivateKey.generate()))
    assert ManifestSigner.load_or_create(tmp_path).public_key == old.public_key  # crashed before endorsing
    assert not (tmp_path / "manifest-signing.key.next").exists()

    new = Ed25519PrivateKey.generate()  # crashed after the endorsement was written
    (tmp_path / "manifest-signing.key.next").write_bytes(_pem(new))
    link = endorse(_load_pem(tmp_path / KEY_FILE), _raw(new), "2026-01-01T00:00:00Z")
    (tmp_path / ENDORSEMENTS_FILE).write_text(json.dumps([link.to_json()]))
    restarted = ManifestSigner.load_or_create(tmp_path)
    assert restarted.public_key == _raw(new) and restarted.endorsements == [link]


def test_central_refuses_to_start_on_a_chain_that_does_not_lead_to_its_key(tmp_path: Path) -> None:
    ManifestSigner.load_or_create(tmp_path)
    (tmp_path / ENDORSEMENTS_FILE).write_text(json.dumps([e.to_json() for e in _chain(_keys(2))]))
    with pytest.raises(KeyRotationError, match="does not lead to the key in use"):
        ManifestSigner.load_or_create(tmp_path)
    with pytest.raises(KeyRotationError):
        rotate_key(tmp_path)
