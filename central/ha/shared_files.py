"""The files every replica of a replicated central must hold alike, kept in PostgreSQL.

Edges pin central's manifest signing key at first contact and refuse manifests signed by any
other: replicas with a key each would look, to an edge that moves between them, like an
impostor. So the first replica to start stores its key (and endorsement chain) in
``ha_shared_files``; every other replica writes the stored ones into its data directory
before it loads its signer.

A data directory that holds a *different* key is a rotation, one way or the other, or a
mistake: its own endorsement chain leading from the shared key means ``modelfleet keys rotate``
ran here, and its key becomes the fleet's; the shared chain leading from its key means another
replica rotated, and this one takes the new key. Anything else (two fleets' data mixed up) is
refused with a clear error rather than forking the key edges trust."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.signing import ENDORSEMENTS_FILE, KEY_FILE, KeyRotationError, ManifestSigner
from fleetwire.signing import KeyEndorsement, raw_public_key, write_atomic

log = logging.getLogger(__name__)

#: The files shared, with their modes on disk.
SHARED_FILES = {KEY_FILE: 0o600, ENDORSEMENTS_FILE: 0o644}


def share_signing_key(conn: psycopg.Connection, data_dir: Path) -> ManifestSigner:
    """Agree on the signing key with the other replicas, then load it from ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('modelfleet-shared-files'))")
        stored = {str(n): bytes(b) for n, b in conn.execute("SELECT name, body FROM ha_shared_files")}
        if KEY_FILE not in stored:
            signer = ManifestSigner.load_or_create(data_dir)  # this replica's key becomes the fleet's
            _store(conn, data_dir)
            log.info("stored this replica's manifest signing key for the other replicas")
            return signer
    local = data_dir / KEY_FILE
    if local.is_file() and local.read_bytes() != stored[KEY_FILE]:
        shared_key = _public_key(stored[KEY_FILE])
        local_signer = ManifestSigner.load_or_create(data_dir)  # finishes a rotation, checks its chain
        if any(e.old_public_key == shared_key for e in local_signer.endorsements):
            _store(conn, data_dir)  # rotated on this replica: the fleet takes the new key
            log.warning("this replica's rotated manifest key is now the one every replica shares")
            return local_signer
        shared_chain = [KeyEndorsement.from_json(e) for e in json.loads(stored.get(ENDORSEMENTS_FILE, b"[]"))]
        if not any(e.old_public_key == local_signer.public_key for e in shared_chain):
            raise KeyRotationError(
                f"{local} holds a different manifest signing key from the one the other replicas share,"
                " and neither endorses the other; move it away to take the shared key (edges trust only one)"
            )
    for name, mode in SHARED_FILES.items():
        body = stored.get(name)
        path = data_dir / name
        if body is not None and (not path.is_file() or path.read_bytes() != body):
            write_atomic(path, body, mode)
    return ManifestSigner.load_or_create(data_dir)


def _public_key(pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyRotationError("the shared manifest signing key is not an Ed25519 key")
    return raw_public_key(key)


def _store(conn: psycopg.Connection, data_dir: Path) -> None:
    """Replace the shared files with this data dir's (one transaction)."""
    with conn.transaction():
        for name in SHARED_FILES:
            path = data_dir / name
            if path.is_file():
                conn.execute(
                    "INSERT INTO ha_shared_files (name, body) VALUES (%s, %s)"
                    " ON CONFLICT (name) DO UPDATE SET body = excluded.body",
                    (name, path.read_bytes()),
                )
