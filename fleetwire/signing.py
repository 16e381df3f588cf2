"""Ed25519 signatures over manifests: central signs, edges verify before fetching.

Both sides sign and verify the same canonical bytes: the manifest's fields as JSON
with sorted keys and no whitespace, the ``signature`` field left out. JSON (not the
protobuf encoding) because the manifest lives as JSON in central's store and REST
API too, and protobuf does not promise one byte form for a message (map order).

Key rotation: central's new key travels with an endorsement, the new public key signed
by the old private key. The chain of endorsements (oldest first) lets an edge that
pinned any earlier key reach the current one, each link verified (``verify_chain``)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fleetwire.manifest import KIND_TENSOR, Manifest

#: Length of a raw Ed25519 public key, the form it travels in (RegisterReply).
PUBLIC_KEY_BYTES = 32
#: Prefix of the bytes an endorsement signs: they can never be mistaken for a manifest's
#: canonical JSON (which starts with ``{``), nor a manifest signature for an endorsement.
ENDORSEMENT_CONTEXT = b"modelfleet manifest key endorsement v1\n"
#: Longest chain an edge walks (one link per rotation): bounds the work a reply can ask for.
MAX_CHAIN_LINKS = 1024


#: Manifest fields newer than the first signed manifests (see ``canonical_bytes``).
_LATE_FIELDS = ("files", "alternatives", "pending")
#: Later fields with a default, left out while they hold it (see ``canonical_bytes``).
_LATE_DEFAULTS = {"kind": KIND_TENSOR}


class SignatureError(ValueError):
    """A manifest is unsigned, or its signature does not match the trusted key."""


def canonical_bytes(manifest: Manifest) -> bytes:
    """The exact bytes a manifest's signature covers."""
    fields = manifest.model_dump(mode="json", exclude={"signature"})
    # Fields added after manifests were first signed are left out while empty, so every
    # manifest signed before they existed keeps verifying.
    for late in _LATE_FIELDS:
        if not fields.get(late):
            fields.pop(late, None)
    for late, default in _LATE_DEFAULTS.items():
        if fields.get(late) == default:
            fields.pop(late, None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign_manifest(manifest: Manifest, key: Ed25519PrivateKey) -> Manifest:
    """A copy of ``manifest`` carrying a signature (hex) over its canonical bytes."""
    signature = key.sign(canonical_bytes(manifest)).hex()
    return manifest.model_copy(update={"signature": signature})


def raw_public_key(key: Ed25519PrivateKey) -> bytes:
    """The raw 32 bytes of ``key``'s public half, the form a key travels and is pinned in."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


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


@dataclass(frozen=True)
class KeyEndorsement:
    """One rotation: ``new_public_key`` signed by the private half of ``old_public_key``."""

    old_public_key: bytes
    new_public_key: bytes
    created_at: str
    signature: bytes

    def to_json(self) -> dict[str, str]:
        """The form central keeps in its data directory (keys and signature in hex)."""
        return {
            "old_public_key": self.old_public_key.hex(),
            "new_public_key": self.new_public_key.hex(),
            "created_at": self.created_at,
            "signature": self.signature.hex(),
        }

    @classmethod
    def from_json(cls, data: dict[str, str]) -> KeyEndorsement:
        """The inverse of ``to_json``; ValueError (or KeyError) on a malformed record."""
        return cls(
            old_public_key=bytes.fromhex(data["old_public_key"]),
            new_public_key=bytes.fromhex(data["new_public_key"]),
            created_at=str(data["created_at"]),
            signature=bytes.fromhex(data["signature"]),
        )


def endorsement_bytes(old_public_key: bytes, new_public_key: bytes, created_at: str) -> bytes:
    """The exact bytes an endorsement's signature covers (both keys have a fixed length)."""
    return ENDORSEMENT_CONTEXT + old_public_key + new_public_key + created_at.encode("utf-8")


def endorse(old_key: Ed25519PrivateKey, new_public_key: bytes, created_at: str) -> KeyEndorsement:
    """``old_key``'s endorsement of ``new_public_key`` (raw 32 bytes)."""
    old_public_key = raw_public_key(old_key)
    public_key_from_bytes(new_public_key)  # refuse to endorse something that is not a key
    signature = old_key.sign(endorsement_bytes(old_public_key, new_public_key, created_at))
    return KeyEndorsement(old_public_key, new_public_key, created_at, signature)


def verify_endorsement(link: KeyEndorsement) -> None:
    """Raise SignatureError unless ``link.old_public_key`` signed ``link``."""
    try:
        public_key_from_bytes(link.old_public_key).verify(
            link.signature, endorsement_bytes(link.old_public_key, link.new_public_key, link.created_at)
        )
        public_key_from_bytes(link.new_public_key)
    except (ValueError, InvalidSignature) as exc:
        raise SignatureError(
            f"the endorsement of key {fingerprint(link.new_public_key)} by {fingerprint(link.old_public_key)}"
            f" ({link.created_at}) does not verify"
        ) from exc


def verify_chain(pinned: bytes, current: bytes, chain: Sequence[KeyEndorsement]) -> int:
    """Raise SignatureError unless ``chain`` leads from ``pinned`` to ``current``.

    The whole chain must hold: every link verifies and continues the one before it (a
    reordered, spliced or truncated chain is refused), ``pinned`` is the old key of one of
    its links and the last link endorses ``current``. Returns the links walked from
    ``pinned``. Central's chain only moves forward: an edge pinned to a newer key finds no
    path back to an older one.
    """
    if not chain:
        raise SignatureError(f"no endorsement leads from the pinned key {fingerprint(pinned)}")
    if len(chain) > MAX_CHAIN_LINKS:
        raise SignatureError(f"a key endorsement chain has at most {MAX_CHAIN_LINKS} links, got {len(chain)}")
    for i, link in enumerate(chain):
        if i and link.old_public_key != chain[i - 1].new_public_key:
            raise SignatureError(
                f"endorsement {i} (by {fingerprint(link.old_public_key)}) does not continue endorsement"
                f" {i - 1} (of {fingerprint(chain[i - 1].new_public_key)})"
            )
        verify_endorsement(link)
    if chain[-1].new_public_key != current:
        raise SignatureError(
            f"the endorsement chain ends at key {fingerprint(chain[-1].new_public_key)},"
            f" not at central's key {fingerprint(current)}"
        )
    olds = [link.old_public_key for link in chain]
    if pinned not in olds:
        raise SignatureError(f"no endorsement in the chain is signed by the pinned key {fingerprint(pinned)}")
    return len(chain) - olds.index(pinned)


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
