"""Central's manifest signing key: made at first start, kept in the data directory.

The private key is a PKCS#8 PEM file, mode 0600, written atomically (a crash never
leaves half a key) and reused on every restart, so the public key edges pinned stays
valid. ``rotate_key`` (``modelfleet keys rotate``) replaces it with a new key and an
endorsement of the new key by the old one, appended to the chain edges follow; the old
private key moves to ``retired-manifest-keys/``, where the operator may delete it. At
start-up, versions stored unsigned or signed by an earlier key are signed again."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.storage.protocols import MetadataStore
from fleetwire.manifest import Manifest
from fleetwire.signing import (
    KeyEndorsement,
    SignatureError,
    endorse,
    fingerprint,
    raw_public_key,
    sign_manifest,
    verify_chain,
    verify_manifest,
    write_atomic,
)

log = logging.getLogger(__name__)

#: File name of the private key inside central's data directory.
KEY_FILE = "manifest-signing.key"
#: The chain of endorsements (JSON list, oldest first) inside central's data directory.
ENDORSEMENTS_FILE = "manifest-key-endorsements.json"
#: Where a rotation leaves the replaced private keys (``<fingerprint>.key``, 0600).
RETIRED_DIR = "retired-manifest-keys"
#: The new key while a rotation is under way; a start-up finishes or drops it.
_NEXT_KEY_FILE = "manifest-signing.key.next"


class KeyRotationError(ValueError):
    """The key files in a data directory are missing, malformed or do not agree."""


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except ValueError as exc:
        raise KeyRotationError(f"{path} does not hold a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyRotationError(f"{path} does not hold an Ed25519 private key")
    return key


def read_endorsements(data_dir: Path) -> list[KeyEndorsement]:
    """The chain kept in ``data_dir`` (empty before the first rotation)."""
    path = data_dir / ENDORSEMENTS_FILE
    if not path.is_file():
        return []
    try:
        return [KeyEndorsement.from_json(item) for item in json.loads(path.read_text())]
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyRotationError(f"{path} is not a list of key endorsements: {exc}") from None


def _write_endorsements(data_dir: Path, chain: list[KeyEndorsement]) -> None:
    body = json.dumps([e.to_json() for e in chain], indent=2) + "\n"
    write_atomic(data_dir / ENDORSEMENTS_FILE, body.encode(), 0o644)


def _retire(data_dir: Path, key: Ed25519PrivateKey) -> Path:
    path = data_dir / RETIRED_DIR / f"{fingerprint(raw_public_key(key))}.key"
    write_atomic(path, _pem(key), 0o600)
    return path


def _finish_pending_rotation(data_dir: Path) -> None:
    """Complete a rotation a crash interrupted after it recorded the endorsement, or drop
    the new key of one that crashed before (nothing announced it yet)."""
    pending = data_dir / _NEXT_KEY_FILE
    if not pending.is_file():
        return
    new_key = _load_key(pending)
    chain = read_endorsements(data_dir)
    if chain and chain[-1].new_public_key == raw_public_key(new_key):
        _retire(data_dir, _load_key(data_dir / KEY_FILE))
        os.replace(pending, data_dir / KEY_FILE)
        log.warning("finished an interrupted rotation to manifest key %s", fingerprint(raw_public_key(new_key)))
    else:
        pending.unlink()


def rotate_key(data_dir: Path, now: datetime | None = None) -> KeyEndorsement:
    """Replace the key in ``data_dir`` with a new one its predecessor endorses.

    Crash-safe in this order: the new key (aside), the chain with its endorsement, the
    old key to ``retired-manifest-keys/``, then the new key in place. Central picks it up
    at its next start."""
    current_path = data_dir / KEY_FILE
    if not current_path.is_file():
        raise KeyRotationError(f"no manifest key in {data_dir}: central makes one at its first start")
    _finish_pending_rotation(data_dir)
    old_key = _load_key(current_path)
    chain = read_endorsements(data_dir)
    _check_chain(data_dir, raw_public_key(old_key), chain)
    new_key = Ed25519PrivateKey.generate()
    created_at = (now or datetime.now(UTC)).isoformat(timespec="seconds").replace("+00:00", "Z")
    link = endorse(old_key, raw_public_key(new_key), created_at)
    write_atomic(data_dir / _NEXT_KEY_FILE, _pem(new_key), 0o600)
    _write_endorsements(data_dir, [*chain, link])
    retired = _retire(data_dir, old_key)
    os.replace(data_dir / _NEXT_KEY_FILE, current_path)
    log.info(
        "rotated manifest key %s -> %s; the old private key is in %s",
        fingerprint(link.old_public_key),
        fingerprint(link.new_public_key),
        retired,
    )
    return link


def _check_chain(data_dir: Path, public_key: bytes, chain: list[KeyEndorsement]) -> None:
    if not chain:
        return
    try:
        verify_chain(chain[0].old_public_key, public_key, chain)
    except SignatureError as exc:
        raise KeyRotationError(f"{data_dir / ENDORSEMENTS_FILE} does not lead to the key in use: {exc}") from None


class ManifestSigner:
    """Signs manifests with central's Ed25519 key; knows the endorsements that lead to it."""

    def __init__(self, key: Ed25519PrivateKey, endorsements: list[KeyEndorsement] | None = None) -> None:
        self._key = key
        self.public_key: bytes = raw_public_key(key)
        #: Every rotation so far, oldest first; sent to edges at registration.
        self.endorsements: list[KeyEndorsement] = list(endorsements or [])

    @classmethod
    def load_or_create(cls, data_dir: Path) -> ManifestSigner:
        """The key in ``data_dir``, made (0600, atomically) if there is none yet, and its
        endorsement chain, checked to lead to it (KeyRotationError otherwise)."""
        path = data_dir / KEY_FILE
        if path.is_file():
            _finish_pending_rotation(data_dir)
            signer = cls(_load_key(path), read_endorsements(data_dir))
            _check_chain(data_dir, signer.public_key, signer.endorsements)
        else:
            signer = cls(Ed25519PrivateKey.generate())
            write_atomic(path, _pem(signer._key), 0o600)
            log.info("made manifest signing key %s in %s", fingerprint(signer.public_key), path)
        return signer

    def sign(self, manifest: Manifest) -> Manifest:
        """``manifest`` with central's signature."""
        return sign_manifest(manifest, self._key)

    def sign_bytes(self, data: bytes) -> bytes:
        """The raw Ed25519 signature of ``data`` (a desired state's seal, context included:
        ``fleetwire.sealing``)."""
        return self._key.sign(data)

    def sign_all(self, manifests: dict[str, Manifest]) -> dict[str, Manifest]:
        """Every artifact's manifest, signed."""
        return {name: self.sign(m) for name, m in manifests.items()}

    def _needs_signing(self, manifest: Manifest) -> bool:
        """True when ``manifest`` is unsigned or signed by a key this one replaced; False when
        signed by this key, or by a key outside the chain (left alone: edges refuse it)."""
        if not manifest.signature:
            return True
        for key in (self.public_key, *reversed([e.old_public_key for e in self.endorsements])):
            try:
                verify_manifest(manifest, key)
            except SignatureError:
                continue
            return key != self.public_key
        log.error("%s:%s is signed by no manifest key of this central", manifest.name, manifest.version)
        return False

    def sign_stored(self, store: MetadataStore) -> int:
        """Sign versions stored unsigned (before manifests were signed) or signed by an
        earlier key (before a rotation); returns how many."""
        signed = 0
        for model in store.list_models():
            for record in store.list_versions(model.name):
                if not any(self._needs_signing(m) for m in [record.manifest, *record.artifacts.values()]):
                    continue
                store.replace_manifests(self.sign(record.manifest), self.sign_all(record.artifacts))
                signed += 1
        if signed:
            log.info("signed %d stored version(s) with manifest key %s", signed, fingerprint(self.public_key))
        return signed
