"""Central's manifest signing key: made at first start, kept in the data directory.

The private key is a PKCS#8 PEM file, mode 0600, written atomically (a crash never
leaves half a key) and reused on every restart, so the public key edges pinned stays
valid. Versions stored before manifests were signed get signed once at start-up."""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.store import MetadataStore
from fleetwire.manifest import Manifest
from fleetwire.signing import fingerprint, sign_manifest, write_atomic

log = logging.getLogger(__name__)

#: File name of the private key inside central's data directory.
KEY_FILE = "manifest-signing.key"


class ManifestSigner:
    """Signs manifests with central's Ed25519 key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public_key: bytes = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def load_or_create(cls, data_dir: Path) -> ManifestSigner:
        """The key in ``data_dir``, made (0600, atomically) if there is none yet."""
        path = data_dir / KEY_FILE
        if path.is_file():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} does not hold an Ed25519 private key")
            signer = cls(key)
        else:
            signer = cls(Ed25519PrivateKey.generate())
            pem = signer._key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            write_atomic(path, pem, 0o600)
            log.info("made manifest signing key %s in %s", fingerprint(signer.public_key), path)
        return signer

    def sign(self, manifest: Manifest) -> Manifest:
        """``manifest`` with central's signature."""
        return sign_manifest(manifest, self._key)

    def sign_all(self, manifests: dict[str, Manifest]) -> dict[str, Manifest]:
        """Every artifact's manifest, signed."""
        return {name: self.sign(m) for name, m in manifests.items()}

    def sign_stored(self, store: MetadataStore) -> int:
        """Sign versions stored before manifests were signed; returns how many."""
        signed = 0
        for model in store.list_models():
            for record in store.list_versions(model.name):
                if record.manifest.signature and all(m.signature for m in record.artifacts.values()):
                    continue
                store.replace_manifests(self.sign(record.manifest), self.sign_all(record.artifacts))
                signed += 1
        if signed:
            log.info("signed %d version(s) stored before manifests were signed", signed)
        return signed
