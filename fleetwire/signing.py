"""Ed25519 signatures over manifests: central signs, edges verify before fetching.

Both sides sign and verify the same canonical bytes: the manifest's fields as JSON
with sorted keys and no whitespace, the ``signature`` field left out. JSON (not the
protobuf encoding) because the manifest lives as JSON in central's store and REST
API too, and protobuf does not promise one byte form for a message (map order)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fleetwire.manifest import Manifest

#: Length of a raw Ed25519 public key, the form it travels in (RegisterReply).
PUBLIC_KEY_BYTES = 32


class SignatureError(ValueError):
    """A manifest is unsigned, or its signature does not match the trusted key."""


def canonical_bytes(manifest: Manifest) -> bytes:
    """The exact bytes a manifest's signature covers."""
    fields = manifest.model_dump(mode="json", exclude={"signature"})
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign_manifest(manifest: Manifest, key: Ed25519PrivateKey) -> Manifest:
    """A copy of ``manifest`` carrying a signature (hex) over its canonical bytes."""
    signature = key.sign(canonical_bytes(manifest)).hex()
    return manifest.model_copy(update={"signature": signature})


def public_key_from_bytes(raw: bytes) -> Ed25519PublicKey:
    """A public key from its raw 32 bytes; SignatureError if they are not one."""
    if len(raw) != PUBLIC_KEY_BYTES:
        raise SignatureError(f"a manifest key has {PUBLIC_KEY_BYTES} bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def fingerprint(raw: bytes) -> str:
    """A short, stable name for a public key in logs and errors (hex of its first 8 bytes)."""
    return raw[:8].hex()


def verify_manifest(manifest: Manifest, public_key: bytes) -> None:
    """Raise SignatureError unless ``manifest`` was signed by the key ``public_key``."""
    if not manifest.signature:
        raise SignatureError(f"{manifest.name}:{manifest.version} has no signature")
    try:
        signature = bytes.fromhex(manifest.signature)
        public_key_from_bytes(public_key).verify(signature, canonical_bytes(manifest))
    except (ValueError, InvalidSignature) as exc:
        raise SignatureError(
            f"{manifest.name}:{manifest.version}: signature does not match key {fingerprint(public_key)}"
        ) from exc


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` via a temporary file created with ``mode``, fsynced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
