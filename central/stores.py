"""The one spot where central opens what it stores: chunk blobs, the metadata store, the event
log, the rollouts and the token stores (files in the data dir, or PostgreSQL / S3 as the
settings say). Everything else receives them opened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from central.auth.tokens import Tokens, open_token_store
from central.membership.event_journal import EventJournal, JournalDB
from central.membership.events import EventLog
from central.registry.blobs import BlobStore, ChunkBlobs
from central.registry.store import MetadataStore
from central.registry.stores import open_metadata_store
from central.rollout.store import RolloutRecords, open_rollout_store
from central.settings import BlobSettings, CentralSettings


@dataclass
class Stores:
    """What one central stores, opened."""

    blobs: ChunkBlobs
    metadata: MetadataStore
    events: EventLog
    rollouts: RolloutRecords
    #: The REST API's operator tokens (``auth.enabled``).
    operator_tokens: Tokens | None
    #: The gRPC Registry's node tokens (``auth.nodes_required``).
    node_tokens: Tokens | None

    def close(self) -> None:
        """Close the metadata store, the token stores and the event log (written out)."""
        self.metadata.close()
        for tokens in (self.operator_tokens, self.node_tokens):
            if tokens is not None:
                tokens.close()
        if self.events.journal is not None:
            self.events.journal.close()


def open_stores(settings: CentralSettings) -> Stores:
    """Open every store the settings name, under ``settings.data_dir`` unless they say elsewhere."""
    data, a, s = settings.data_dir, settings.auth, settings.store
    blobs = open_blobs(settings.blobs, data / "blobs")
    blobs.remove_temp_files()
    return Stores(
        blobs=blobs,
        metadata=open_metadata_store(s, data / "registry.sqlite3"),
        events=_event_log(settings),
        rollouts=open_rollout_store(s, data / "rollouts.sqlite3"),
        operator_tokens=(
            open_token_store(s.url, a.tokens_path(data), "operator", connect_timeout_s=s.connect_timeout_s)
            if a.enabled
            else None
        ),
        node_tokens=(
            open_token_store(s.url, a.node_tokens_path(data), "node", connect_timeout_s=s.connect_timeout_s)
            if a.nodes_required
            else None
        ),
    )


def open_blobs(settings: BlobSettings, root: Path) -> ChunkBlobs:
    """The chunk store the settings name: an S3 bucket, or the directory ``root``."""
    if settings.bucket is None:
        return BlobStore(root)
    from central.registry.s3blobs import S3BlobStore  # obstore only where S3 is configured

    return S3BlobStore.connect(
        bucket=settings.bucket,
        endpoint=settings.s3_endpoint,
        region=settings.region,
        access_key=settings.access_key.get_secret_value() if settings.access_key else None,
        secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
        prefix=settings.prefix,
        grace_s=settings.gc_grace_s,
    )


def _event_log(settings: CentralSettings) -> EventLog:
    """The event log, restored from ``events.sqlite3`` (or PostgreSQL with ``store.url``) and journaled
    there (unless ``events.persist`` is off)."""
    e = settings.events
    journal = None
    if e.persist:
        target: Path | JournalDB = settings.data_dir / "events.sqlite3"
        if settings.store.url is not None:
            from central.membership.postgres_journal import PostgresJournalDB  # the [postgres] extra

            target = PostgresJournalDB(
                settings.store.url,
                connect_timeout_s=settings.store.connect_timeout_s,
                replica=settings.ha.replica_id or "",
            )
        journal = EventJournal(target, e.kept, flush_interval_s=e.flush_interval_s, flush_max_events=e.flush_max_events)
    return EventLog(e.kept, journal=journal)
