"""Registry metadata on PostgreSQL (psycopg 3 with a connection pool), for central replicas that
share one registry. Same semantics as ``SQLiteMetadataStore``: a version becomes visible in
one transaction, sequence numbers per model are never reused, a taken (name, version)
raises ``VersionExists``. Manifests are JSONB."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from central.storage.postgres.pool import StoreUnavailable, masked_url, open_pool
from central.storage.postgres.shared import SharedTransaction
from central.storage.protocols import ModelRecord, VersionExists, VersionRecord, manifest_digests, utc_now
from fleetwire.manifest import Manifest

_log = logging.getLogger(__name__)

__all__ = ["PostgresMetadataStore", "StoreUnavailable", "masked_url"]

_SELECT_VERSION = "SELECT name, version, seq, manifest, created_at, artifacts FROM versions"


def _artifacts_json(artifacts: dict[str, Manifest]) -> Jsonb:
    return Jsonb({k: m.model_dump(mode="json") for k, m in artifacts.items()})


class PostgresMetadataStore:
    """``MetadataStore`` on a PostgreSQL database; applies the bundled migrations on open.
    Thread-safe: each call borrows a pooled connection."""

    def __init__(
        self, url: str, *, pool_size: int = 4, connect_timeout_s: float = 10.0, shared: SharedTransaction | None = None
    ) -> None:
        """``shared``: the transactions this store's writes join (``transaction()``) with other stores'."""
        self._shared = shared or SharedTransaction()
        self._pool, applied = open_pool(url, name="registry", pool_size=pool_size, connect_timeout_s=connect_timeout_s)
        _log.info("registry metadata on PostgreSQL %s; migrations applied now: %s", masked_url(url), applied or "none")

    def transaction(self) -> AbstractContextManager[None]:
        """One transaction on this store's pool that the stores sharing ``shared`` join (this thread)."""
        return self._shared.transaction(self._pool)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def reachable(self) -> bool:
        """False while the pool's last attempt to connect failed; asking starts a new attempt
        (see :meth:`LoopSafePool.reachable`)."""
        return self._pool.reachable()

    def list_models(self) -> list[ModelRecord]:
        """Every model with at least one version, by name."""
        rows = self._query(
            "SELECT m.name, m.created_at, COUNT(v.version),"
            " (SELECT version FROM versions WHERE name = m.name ORDER BY seq DESC LIMIT 1)"
            " FROM models m JOIN versions v ON v.name = m.name GROUP BY m.name, m.created_at"
            ' ORDER BY m.name COLLATE "C"'
        )
        return [ModelRecord(name=r[0], created_at=r[1], versions=r[2], latest=r[3]) for r in rows]

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Versions of ``name``, oldest first."""
        return [self._record(r) for r in self._query(f"{_SELECT_VERSION} WHERE name = %s ORDER BY seq", (name,))]

    def get_version(self, name: str, version: str) -> VersionRecord | None:
        """One version, or None. Inside ``transaction()`` the row stays locked (``FOR UPDATE``)
        until the transaction ends: a version is read in a transaction to be rewritten
        (a conversion adding an artifact, a pending candidate promoted or rejected), and two
        replicas doing that at once must not both start from the same manifest, or the later
        write drops the earlier one's change. The second waits, then reads the first's."""
        lock = " FOR UPDATE" if self._shared.active() else ""
        rows = self._query(f"{_SELECT_VERSION} WHERE name = %s AND version = %s{lock}", (name, version))
        return self._record(rows[0]) if rows else None

    def next_seq(self, name: str) -> int:
        """One more than the highest sequence number of ``name`` (1 for a new model)."""
        return int(self._query("SELECT COALESCE(MAX(seq), 0) + 1 FROM versions WHERE name = %s", (name,))[0][0])

    def insert_version(self, manifest: Manifest, artifacts: dict[str, Manifest] | None = None) -> VersionRecord:
        """Commit ``manifest`` and every artifact's manifest in one transaction. The model row is
        locked first, so two replicas pushing the same model never hand out one seq twice."""
        artifacts = artifacts or {manifest.artifact: manifest}
        try:
            with self._shared.connection(self._pool) as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO models (name, created_at) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                    (manifest.name, utc_now()),
                )
                conn.execute("SELECT 1 FROM models WHERE name = %s FOR UPDATE", (manifest.name,))
                row = conn.execute(
                    "INSERT INTO versions (name, version, seq, manifest, created_at, artifacts)"
                    " SELECT %s, %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s FROM versions WHERE name = %s"
                    " RETURNING seq",
                    (
                        manifest.name,
                        manifest.version,
                        Jsonb(manifest.model_dump(mode="json")),
                        manifest.created_at,
                        _artifacts_json(artifacts),
                        manifest.name,
                    ),
                ).fetchone()
        except psycopg.errors.UniqueViolation as exc:
            raise VersionExists(f"{manifest.name}:{manifest.version}") from exc
        assert row is not None
        return VersionRecord(
            manifest.name, manifest.version, int(row[0]), manifest, manifest.created_at, dict(artifacts)
        )

    def replace_manifests(self, manifest: Manifest, artifacts: dict[str, Manifest]) -> None:
        """Overwrite a stored version's manifests in one statement (same chunks; e.g. now signed)."""
        with self._shared.connection(self._pool) as conn:
            conn.execute(
                "UPDATE versions SET manifest = %s, artifacts = %s WHERE name = %s AND version = %s",
                (Jsonb(manifest.model_dump(mode="json")), _artifacts_json(artifacts), manifest.name, manifest.version),
            )

    def delete_version(self, name: str, version: str) -> bool:
        """Remove a version (and the model row once it has none left), under the model's row lock."""
        with self._shared.connection(self._pool) as conn, conn.transaction():
            conn.execute("SELECT 1 FROM models WHERE name = %s FOR UPDATE", (name,))
            cur = conn.execute("DELETE FROM versions WHERE name = %s AND version = %s", (name, version))
            conn.execute(
                "DELETE FROM models WHERE name = %s AND NOT EXISTS (SELECT 1 FROM versions WHERE name = %s)",
                (name, name),
            )
            return cur.rowcount > 0

    def referenced_digests(self) -> set[str]:
        """Every chunk digest that some stored version uses (every file of every artifact,
        the served manifest's alternatives included)."""
        digests: set[str] = set()
        for manifest, artifacts in self._query("SELECT manifest, artifacts FROM versions"):
            manifest_digests(digests, manifest)
            for artifact in artifacts.values():
                manifest_digests(digests, artifact)
        return digests

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._shared.connection(self._pool) as conn:
            return conn.execute(sql.encode(), args).fetchall()

    @staticmethod
    def _record(row: tuple[Any, ...]) -> VersionRecord:
        manifest = Manifest.model_validate(row[3])
        artifacts = {k: Manifest.model_validate(v) for k, v in row[5].items()} or {manifest.artifact: manifest}
        return VersionRecord(str(row[0]), str(row[1]), int(row[2]), manifest, str(row[4]), artifacts)
