"""The files every replica of a replicated central must hold alike, kept in PostgreSQL.

Edges pin central's manifest signing key at first contact and refuse manifests signed by any
other: replicas with a key each would look, to an edge that moves between them, like an
impostor. So the first replica to start stores its key (and endorsement chain) in
``ha_shared_files``; every other replica writes the stored ones into its data directory
before it loads its signer. A data directory that already holds a *different* key is refused
with a clear error rather than overwritten (two fleets' data mixed up, or a rotation done on
one replica's disk only: ``modelfleet keys rotate`` then this replica's restart would fork
the key)."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

from central.registry.signing import ENDORSEMENTS_FILE, KEY_FILE, KeyRotationError, ManifestSigner
from fleetwire.signing import write_atomic

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
            for name in SHARED_FILES:
                path = data_dir / name
                if path.is_file():
                    conn.execute("INSERT INTO ha_shared_files (name, body) VALUES (%s, %s)", (name, path.read_bytes()))
            log.info("stored this replica's manifest signing key for the other replicas")
            return signer
    for name, mode in SHARED_FILES.items():
        path = data_dir / name
        body = stored.get(name)
        if body is None:
            continue
        if name == KEY_FILE and path.is_file() and path.read_bytes() != body:
            raise KeyRotationError(
                f"{path} holds a different manifest signing key from the one the other replicas share;"
                " move it away to take the shared key (edges trust only one)"
            )
        if not path.is_file() or path.read_bytes() != body:
            write_atomic(path, body, mode)
    return ManifestSigner.load_or_create(data_dir)
