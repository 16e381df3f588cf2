"""What central's services need from storage, one small protocol per store, and the plain
records they hand back. The SQLite, PostgreSQL, file and S3 implementations sit beside this
module (``sqlite/``, ``postgres/``, ``files/``, ``blobs/``); ``factory.open_storage`` picks
them once at start.

This module imports no implementation and, at run time, none of central's services (their
types only under ``TYPE_CHECKING``), so every service may import it without a cycle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from central.errors import Conflict
from fleetwire.manifest import Manifest

if TYPE_CHECKING:  # services import this module: their types only for the checker
    from central.auth.tokens import Role, TokenRecord
    from central.rollout.model import Rollout

__all__ = [
    "ChunkBlobs",
    "CorruptBlob",
    "DecisionRecords",
    "JournalDB",
    "JournalRow",
    "MetadataStore",
    "ModelRecord",
    "Release",
    "RolloutRecords",
    "ShadowCountRow",
    "ShadowCounts",
    "StaleRollout",
    "Tokens",
    "VersionExists",
    "VersionRecord",
    "manifest_digests",
    "utc_now",
]


def utc_now() -> str:
    """RFC 3339 timestamp, UTC, millisecond precision."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def manifest_digests(digests: set[str], manifest: dict[str, Any]) -> None:
    """Add the chunk digests of a stored manifest's JSON (graph, data files, alternatives)."""
    for artifact in [manifest, *manifest.get("alternatives", ())]:
        for file in [artifact, *artifact.get("files", ())]:
            digests.update(c["digest"] for c in file["chunks"])


# -- registry metadata ----------------------------------------------------------------------


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


class VersionExists(Exception):
    """Raised by ``insert_version`` when (name, version) is already committed."""


class MetadataStore(Protocol):
    """What the registry needs from a metadata database. The schema is two tables with plain
    columns and a JSON manifest, the same on SQLite and PostgreSQL."""

    def close(self) -> None:
        """Release connections."""

    def reachable(self) -> bool:
        """Whether the database answers now (quick: it is asked on every ``/readyz``)."""

    def list_models(self) -> list[ModelRecord]:
        """Every model with at least one version, by name."""

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Versions of a model, oldest first."""

    def get_version(self, name: str, version: str) -> VersionRecord | None:
        """One version, or None. Read inside the storage's ``transaction()``, no other
        transaction can change it until that one ends (a read-modify-write is safe): SQLite's
        write transaction holds the database, PostgreSQL locks the row."""

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


# -- rollouts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A model's stable version and the last rollout id a plain push superseded."""

    model: str
    stable: str | None
    epoch: int


class StaleRollout(Conflict):
    """``update`` of a rollout another writer changed since this store last read it: nothing
    was written (read it again, decide again; an operator gets a 409 and retries). Only where
    several processes write rollouts."""


class RolloutRecords(Protocol):
    """What ``RolloutBook`` needs of a store: rollout rows (JSON bodies) and, per model, the
    version every node serves unless a rollout says otherwise (``Release``)."""

    def close(self) -> None: ...
    def releases(self) -> dict[str, Release]: ...
    def set_release(self, model: str, stable: str | None, epoch: int) -> None: ...
    def insert(self, rollout: Rollout) -> Rollout: ...
    def update(self, rollout: Rollout, fence: int | None = None) -> None:
        """Persist a rollout's new state. Where several processes share the store: refused
        (``StaleRollout``) when another wrote it since this store read it, and, with ``fence``
        (the leader epoch the writer holds), refused (``Fenced``) unless it still leads."""
        ...

    def all(self) -> list[Rollout]: ...
    def max_id(self, model: str) -> int: ...


# -- decisions beyond the registry ----------------------------------------------------------


class DecisionRecords(Protocol):
    """What central decided besides versions and rollouts, kept so that a restart (and, on
    replicas, every replica and the next leader) keeps it: per ``kind`` (``drift_flag``,
    ``drift_baseline``, ``verdict``, ``transfer``), a map of string keys to JSON bodies.

    ``fence``: the leader epoch a decision of the leader is made at; where replicas share the
    store the write is refused (``central.ha.fencing.Fenced``) unless that epoch is still the
    current one. A single central has no epoch and nobody to be fenced by."""

    def load(self, kind: str) -> dict[str, Any]:
        """Every record of ``kind``."""
        ...

    def write(
        self,
        kind: str,
        puts: Mapping[str, Any],
        deletes: Iterable[str] = (),
        *,
        fence: int | None = None,
        also: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Insert or replace ``puts`` and delete ``deletes`` of ``kind`` (and insert or replace
        ``also``'s records, kind → key → body) in one transaction."""
        ...

    def add(self, kind: str, key: str, body: Any) -> bool:
        """Store ``body`` unless ``key`` has a record already (first wins); True if stored."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ShadowCountRow:
    """The live shadow counts one node last reported for one version (``candidate``: the
    pending artifact they are for, ``""`` for drift counts of the served artifact)."""

    model: str
    version: str
    candidate: str
    node_id: str
    artifact: str
    raw: dict[str, Any]
    """``ShadowInfo`` as JSON, as the edge sent it."""
    at: float


class ShadowCounts(Protocol):
    """Where the heartbeats' shadow counts go from the process that heard them to the one that
    judges them (the leader): in memory on a single central, PostgreSQL between replicas."""

    def put(self, kind: str, rows: Iterable[ShadowCountRow]) -> None:
        """Note the latest counts (buffered until ``flush``)."""
        ...

    def flush(self) -> None:
        """Write what ``put`` buffered (kept for the next flush when the store is away)."""
        ...

    def changed(self, kind: str) -> list[ShadowCountRow]:
        """The rows of ``kind`` written since the last call (every row at the first)."""
        ...


# -- API tokens -----------------------------------------------------------------------------


class Tokens(Protocol):
    """A token store: a JSON file (``files.tokens.TokenStore``) or PostgreSQL. Only hashes are kept."""

    @property
    def location(self) -> str:
        """Where the tokens are, for messages (never a password)."""
        ...

    def records(self) -> list[TokenRecord]: ...
    def verify(self, token: str) -> TokenRecord | None: ...
    def create(self, name: str, role: Role, node_id: str | None = None) -> str: ...
    def revoke(self, name: str) -> None: ...
    def revoke_node(self, node_id: str) -> list[str]: ...
    def close(self) -> None: ...


# -- the event journal ----------------------------------------------------------------------

#: One row of the journal's ``events``: seq, ts, type, node_id, body (the event as JSON).
JournalRow = tuple[int | None, int, str, str | None, str]


class JournalDB(Protocol):
    """Where the event journal's rows live: SQLite or PostgreSQL. Called from one thread at a
    time (the journal holds its lock); each method is one transaction."""

    #: What a failed read or write raises (the journal counts a failed write and goes on).
    errors: tuple[type[Exception], ...]

    def load(self) -> tuple[dict[str, int], int, int]:
        """The meta values, the highest seq stored (0 when none) and the number of rows."""
        ...

    def bodies(self, limit: int) -> list[str]:
        """The bodies of the newest ``limit`` events, newest first."""
        ...

    def write(self, rows: list[JournalRow], prune_to: int | None, meta: dict[str, int]) -> int | None:
        """Insert (or replace) ``rows``; when ``prune_to`` is set, drop all but the newest
        ``prune_to`` rows and return the rows left; store ``meta``. All in one transaction."""
        ...

    def set_meta(self, meta: dict[str, int]) -> None:
        """Store ``meta`` (key -> value)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


# -- chunk blobs ----------------------------------------------------------------------------


class CorruptBlob(Exception):
    """A stored blob's bytes no longer hash to its digest; it is never served."""


class ChunkBlobs(Protocol):
    """What central's callers need from a chunk store. Blocking calls: async callers run them in
    a thread (``asyncio.to_thread``)."""

    def put(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its own digest (idempotent); returns (digest, newly stored)."""
        ...

    def has(self, digest: str) -> bool:
        """True when the blob is stored."""
        ...

    def read(self, digest: str) -> bytes:
        """The whole blob, checked against its digest (``CorruptBlob``; ``FileNotFoundError``
        when absent)."""
        ...

    def delete(self, digest: str) -> bool:
        """Delete the blob unless it is younger than the store's grace period; True if deleted."""
        ...

    def digests(self) -> Iterator[str]:
        """Every stored digest."""
        ...

    def usage(self) -> tuple[int, int]:
        """(blobs, bytes) stored."""
        ...

    def remove_temp_files(self) -> int:
        """Delete what a crashed write left behind; returns how many."""
        ...
