"""Registry metadata behind a small interface, so SQLite can give way to PostgreSQL.

The schema is two tables with plain columns and a JSON manifest; no SQLite-only
features beyond what a ``CREATE TABLE`` in PostgreSQL would take as is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleetwire.manifest import Manifest


@dataclass(frozen=True)
class VersionRecord:
    """One stored version: its manifest plus registry bookkeeping."""

    name: str
    version: str
    seq: int
    manifest: Manifest
    created_at: str
    #: Every stored artifact's manifest by name ("int8-u8s8-qdq", "fp32", ...); includes ``manifest``.
    artifacts: dict[str, Manifest] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRecord:
    """A model with a summary of its versions."""

    name: str
    versions: int
    latest: str | None
    created_at: str


class MetadataStore(Protocol):
    """What the registry needs from a metadata database."""

    def close(self) -> None:
        """Release connections."""

    def reachable(self) -> bool:
        """Whether the database answers now (quick: it is asked on every ``/readyz``)."""

    def list_models(self) -> list[ModelRecord]:
        """Every model with at least one version, by name."""

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Versions of a model, oldest first."""

    def get_version(self, name: str, version: str) -> VersionRecord | None:
        """One version, or None."""

    def next_seq(self, name: str) -> int:
        """The sequence number the next version of ``name`` will get."""

    def insert_version(self, manifest: Manifest, artifacts: dict[str, Manifest] | None = None) -> VersionRecord:
        """Commit a version and its artifacts atomically; raises ``VersionExists`` if it is taken."""

    def replace_manifests(self, manifest: Manifest, artifacts: dict[str, Manifest]) -> None:
        """Overwrite a stored version's manifests (same chunks; e.g. now signed)."""

    def delete_version(self, name: str, version: str) -> bool:
        """Remove a version; False if it did not exist."""

    def referenced_digests(self) -> set[str]:
        """Every chunk digest any stored version uses."""


class VersionExists(Exception):
    """Raised by ``insert_version`` when (name, version) is already committed."""
