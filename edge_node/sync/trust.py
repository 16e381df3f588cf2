"""Which key may sign manifests for this edge: pinned on first contact with central.

Trust on first use: the public key central sends at registration is written to the
data directory the first time and compared on every later registration. A different
key is taken (re-pinned) only when central's chain of key endorsements leads from the
pinned key to it, every link verified: that is how a rotation (``modelfleet keys
rotate``) reaches the fleet. Any other key is refused (logged as an error; manifests keep
being checked against the pinned key, so nothing signed by the new key is loaded) unless
the operator sets ``manifest_key_repin``, the manual override."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from fleetwire.manifest import Manifest
from fleetwire.signing import (
    PUBLIC_KEY_BYTES,
    KeyEndorsement,
    SignatureError,
    fingerprint,
    verify_chain,
    verify_manifest,
    write_atomic,
)

log = logging.getLogger(__name__)

#: File name of the pinned key (raw 32 bytes) inside the edge's data directory.
PINNED_KEY_FILE = "central-manifest-key.pub"


class ManifestTrust:
    """The pinned manifest key of one edge and the check every manifest goes through."""

    def __init__(self, data_dir: Path, repin: bool = False) -> None:
        self._path = data_dir / PINNED_KEY_FILE
        self._repin = repin
        self.pinned: bytes | None = self._read()

    def _read(self) -> bytes | None:
        if not self._path.is_file():
            return None
        raw = self._path.read_bytes()
        if len(raw) != PUBLIC_KEY_BYTES:
            log.error("ignoring %s: not a %d-byte key", self._path, PUBLIC_KEY_BYTES)
            return None
        return raw

    def offer(self, key: bytes, endorsements: Sequence[KeyEndorsement] = ()) -> bool:
        """Take the key central announced: pin it if none is pinned, re-pin it if
        ``endorsements`` lead to it from the pinned key (or re-pinning is on).

        Returns False when it differs from the pinned key and is refused.
        """
        if key == self.pinned:
            return True
        if len(key) != PUBLIC_KEY_BYTES:
            log.error("central announced no usable manifest key (%d bytes); manifests cannot be verified", len(key))
            return False
        if self.pinned is not None and not self._repin:
            try:
                links = verify_chain(self.pinned, key, endorsements)
            except SignatureError as exc:
                log.error(
                    "central's manifest key %s differs from the pinned key %s and is not endorsed by it (%s):"
                    " refusing it; every manifest it signs is refused (set manifest_key_repin to override)",
                    fingerprint(key),
                    fingerprint(self.pinned),
                    exc,
                )
                return False
            log.info("central rotated its manifest key: %d verified endorsement(s) lead to it", links)
        self._pin(key)
        return True

    def _pin(self, key: bytes) -> None:
        write_atomic(self._path, key, 0o644)
        verb = "re-pinned" if self.pinned is not None else "pinned"
        self.pinned = key
        log.info("%s central's manifest key %s", verb, fingerprint(key))

    def verify(self, manifest: Manifest) -> None:
        """Raise SignatureError unless the pinned key signed ``manifest``."""
        if self.pinned is None:
            raise SignatureError(f"{manifest.name}:{manifest.version}: no manifest key pinned yet")
        verify_manifest(manifest, self.pinned)
