"""Registry metadata on SQLite (the ``models`` and ``versions`` tables of ``central.sqlite3``).
A version becomes visible in one transaction after all its chunks are durable, so a crash
mid-push leaves no half version."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from central.storage.protocols import ModelRecord, VersionExists, VersionRecord, manifest_digests, utc_now
from central.storage.sqlite.database import SQLiteDatabase, database
from fleetwire.manifest import Manifest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL REFERENCES models(name),
    version TEXT NOT NULL,
    seq INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    artifacts TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX IF NOT EXISTS versions_by_seq ON versions (name, seq);
"""


class SQLiteMetadataStore:
    """``MetadataStore`` on a SQLite file (or on ``central.sqlite3``'s shared connection, so that
    its writes can join a transaction of the rollout store's); safe to call from worker threads."""

    def __init__(self, target: Path | SQLiteDatabase) -> None:
        self._db = database(target)
        self._db.executescript(_SCHEMA)
        if "artifacts" not in self._db.columns("versions"):  # registries made before artifacts were kept
            self._db.execute("ALTER TABLE versions ADD COLUMN artifacts TEXT NOT NULL DEFAULT '{}'")

    def close(self) -> None:
        """Done with the connection (closed with its last user)."""
        self._db.release()

    def reachable(self) -> bool:
        """A local file: always."""
        return True

    def list_models(self) -> list[ModelRecord]:
        """Every model with at least one version, by name."""
        rows = self._query(
            "SELECT m.name, m.created_at, COUNT(v.version),"
            " (SELECT version FROM versions WHERE name = m.name ORDER BY seq DESC LIMIT 1)"
            " FROM models m JOIN versions v ON v.name = m.name GROUP BY m.name, m.created_at ORDER BY m.name"
        )
        return [ModelRecord(name=r[0], created_at=r[1], versions=r[2], latest=r[3]) for r in rows]

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Versions of ``name``, oldest first."""
        rows = self._query(
            "SELECT name, version, seq, manifest, created_at, artifacts FROM versions WHERE name = ? ORDER BY seq",
            (name,),
        )
        return [self._record(r) for r in rows]

    def get_version(self, name: str, version: str) -> VersionRecord | None:
        """One version, or None."""
        rows = self._query(
            "SELECT name, version, seq, manifest, created_at, artifacts FROM versions WHERE name = ? AND version = ?",
            (name, version),
        )
        return self._record(rows[0]) if rows else None

    def next_seq(self, name: str) -> int:
        """One more than the highest sequence number of ``name`` (1 for a new model)."""
        rows = self._query("SELECT COALESCE(MAX(seq), 0) FROM versions WHERE name = ?", (name,))
        return int(rows[0][0]) + 1

    def insert_version(self, manifest: Manifest, artifacts: dict[str, Manifest] | None = None) -> VersionRecord:
        """Commit ``manifest`` (the served artifact) and every artifact's manifest in one transaction."""
        artifacts = artifacts or {manifest.artifact: manifest}
        artifacts_json = json.dumps({k: m.model_dump() for k, m in artifacts.items()})
        now = utc_now()
        try:
            with self._db.transaction() as conn:
                conn.execute(
                    "INSERT INTO models (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                    (manifest.name, now),
                )
                (seq,) = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM versions WHERE name = ?", (manifest.name,)
                ).fetchone()
                conn.execute(
                    "INSERT INTO versions (name, version, seq, manifest, created_at, artifacts)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        manifest.name,
                        manifest.version,
                        seq,
                        manifest.model_dump_json(),
                        manifest.created_at,
                        artifacts_json,
                    ),
                )
        except sqlite3.IntegrityError as exc:
            raise VersionExists(f"{manifest.name}:{manifest.version}") from exc
        return VersionRecord(manifest.name, manifest.version, int(seq), manifest, manifest.created_at, dict(artifacts))

    def replace_manifests(self, manifest: Manifest, artifacts: dict[str, Manifest]) -> None:
        """Overwrite a stored version's manifests in one statement (same chunks; e.g. now signed)."""
        artifacts_json = json.dumps({k: m.model_dump() for k, m in artifacts.items()})
        self._db.execute(
            "UPDATE versions SET manifest = ?, artifacts = ? WHERE name = ? AND version = ?",
            (manifest.model_dump_json(), artifacts_json, manifest.name, manifest.version),
        )

    def delete_version(self, name: str, version: str) -> bool:
        """Remove a version (and the model row once it has none left)."""
        with self._db.transaction() as conn:
            cur = conn.execute("DELETE FROM versions WHERE name = ? AND version = ?", (name, version))
            conn.execute(
                "DELETE FROM models WHERE name = ? AND NOT EXISTS (SELECT 1 FROM versions WHERE name = ?)",
                (name, name),
            )
        return cur.rowcount > 0

    def referenced_digests(self) -> set[str]:
        """Every chunk digest that some stored version uses: every file (graph and external
        data) of every artifact, the alternatives the served manifest carries included."""
        digests: set[str] = set()
        for manifest_json, artifacts_json in self._query("SELECT manifest, artifacts FROM versions"):
            manifest_digests(digests, json.loads(manifest_json))
            for artifact in json.loads(artifacts_json).values():
                manifest_digests(digests, artifact)
        return digests

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        return self._db.query(sql, args)

    @staticmethod
    def _record(row: tuple[Any, ...]) -> VersionRecord:
        manifest = Manifest.model_validate_json(str(row[3]))
        artifacts = {k: Manifest.model_validate(v) for k, v in json.loads(row[5]).items()} or {
            manifest.artifact: manifest
        }
        return VersionRecord(str(row[0]), str(row[1]), int(row[2]), manifest, str(row[4]), artifacts)
