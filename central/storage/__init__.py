"""Everything central keeps: registry metadata, rollouts, API tokens, the event journal and
chunk blobs, each behind a small protocol (``protocols``) with SQLite/file, PostgreSQL and
S3 implementations, opened once by ``factory.open_storage``.

This package's ``__init__`` imports only the protocols: services import them without pulling
in (or cycling through) the implementations."""

from __future__ import annotations

from central.storage.protocols import (
    ChunkBlobs,
    CorruptBlob,
    JournalDB,
    MetadataStore,
    ModelRecord,
    Release,
    RolloutRecords,
    Tokens,
    VersionExists,
    VersionRecord,
)

__all__ = [
    "ChunkBlobs",
    "CorruptBlob",
    "JournalDB",
    "MetadataStore",
    "ModelRecord",
    "Release",
    "RolloutRecords",
    "Tokens",
    "VersionExists",
    "VersionRecord",
]
