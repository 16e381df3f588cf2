"""Opens every store central keeps, once, from the settings: SQLite in the data dir (one
``central.sqlite3``, plus the token files and the blob directory), or PostgreSQL when
``store.url`` is set (with an S3 bucket when ``blobs.bucket`` is). Nothing else in central
asks which backend it runs on."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from central.settings import BlobSettings, CentralSettings
from central.storage.blobs.local import BlobStore
from central.storage.protocols import ChunkBlobs, DecisionRecords, JournalDB, MetadataStore, RolloutRecords, Tokens
from central.storage.sqlite.database import FILE_NAME, SQLiteDatabase
from central.storage.sqlite.decisions import SQLiteDecisionStore
from central.storage.sqlite.events import SQLiteJournalDB
from central.storage.sqlite.legacy import LEGACY_REGISTRY, import_legacy_files
from central.storage.sqlite.registry import SQLiteMetadataStore
from central.storage.sqlite.rollouts import SQLiteRolloutStore
from central.storage.tokens import open_token_store

__all__ = ["Storage", "open_blobs", "open_storage", "open_token_store"]


def _no_transaction() -> AbstractContextManager[object]:
    return nullcontext()


@dataclass
class Storage:
    """Everything central stores, opened once. ``transaction()`` groups the calling thread's writes
    of ``metadata`` and ``rollouts`` into one commit (SQLite: their one connection; PostgreSQL:
    one pooled connection both stores use while it is open)."""

    metadata: MetadataStore
    rollouts: RolloutRecords
    #: Drift flags and fallbacks, verdicts, the transfer policy (``DecisionRecords``).
    decisions: DecisionRecords
    blobs: ChunkBlobs
    #: The event journal's rows; None when ``events.persist`` is off.
    events: JournalDB | None
    #: Whether the data dir held no registry before this start (``central_started``'s ``fresh``).
    fresh: bool
    #: One transaction around writes of several stores (see the class).
    transaction: Callable[[], AbstractContextManager[object]] = field(default=_no_transaction)
    #: The REST API's operator tokens (``auth.enabled``), else None.
    operator_tokens: Tokens | None = None
    #: The gRPC Registry's node tokens (``auth.nodes_required``), else None.
    node_tokens: Tokens | None = None

    def close(self) -> None:
        """Close every store (for callers that did not hand the stores on to owners that close them)."""
        self.metadata.close()
        self.rollouts.close()
        self.decisions.close()
        for closeable in (self.events, self.operator_tokens, self.node_tokens):
            if closeable is not None:
                closeable.close()


def open_storage(settings: CentralSettings) -> Storage:
    """PostgreSQL when ``store.url`` is set (migrated on open), else SQLite in the data dir."""
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    fresh = not (data / FILE_NAME).exists() and not (data / LEGACY_REGISTRY).exists()
    blobs = open_blobs(settings.blobs, data / "blobs")
    url = settings.store.url
    storage = _open_sqlite(settings, fresh, blobs) if url is None else _open_postgres(settings, url, fresh, blobs)
    storage.operator_tokens, storage.node_tokens = _tokens(settings)
    return storage


def _open_sqlite(settings: CentralSettings, fresh: bool, blobs: ChunkBlobs) -> Storage:
    """Registry and rollouts on one shared connection (one transaction can hold both), the
    journal on a connection of its own; files of an older central imported first."""
    path = settings.data_dir / FILE_NAME
    import_legacy_files(path, settings.data_dir)
    db = SQLiteDatabase(path)
    metadata, rollouts, decisions = SQLiteMetadataStore(db), SQLiteRolloutStore(db), SQLiteDecisionStore(db)
    events = SQLiteJournalDB(path) if settings.events.persist else None
    return Storage(metadata, rollouts, decisions, blobs, events, fresh=fresh, transaction=db.transaction)


def _open_postgres(settings: CentralSettings, url: str, fresh: bool, blobs: ChunkBlobs) -> Storage:
    """Every store on PostgreSQL, each with its own pool (the first to open applies the migrations);
    the registry's and the rollouts' share transactions (``SharedTransaction``)."""
    try:  # psycopg is the [postgres] extra, which a SQLite central does not need
        from central.storage.postgres.decisions import PostgresDecisionStore
        from central.storage.postgres.events import PostgresJournalDB
        from central.storage.postgres.registry import PostgresMetadataStore
        from central.storage.postgres.rollouts import PostgresRolloutStore
        from central.storage.postgres.shared import SharedTransaction
    except ImportError as exc:
        raise RuntimeError(
            "store.url (PostgreSQL) needs the postgres extra: pip install 'modelfleet[postgres]'"
        ) from exc
    s = settings.store
    shared = SharedTransaction()
    metadata = PostgresMetadataStore(url, pool_size=s.pool_size, connect_timeout_s=s.connect_timeout_s, shared=shared)
    rollouts = PostgresRolloutStore(url, pool_size=s.pool_size, connect_timeout_s=s.connect_timeout_s, shared=shared)
    decisions = PostgresDecisionStore(url, connect_timeout_s=s.connect_timeout_s)
    events = None
    if settings.events.persist:
        replica = settings.ha.replica_id or ""
        events = PostgresJournalDB(url, connect_timeout_s=s.connect_timeout_s, replica=replica)
    return Storage(metadata, rollouts, decisions, blobs, events, fresh=fresh, transaction=metadata.transaction)


def _tokens(settings: CentralSettings) -> tuple[Tokens | None, Tokens | None]:
    """The operator and node token stores the auth settings turn on (files, or PostgreSQL)."""
    a, s, data = settings.auth, settings.store, settings.data_dir
    timeout = s.connect_timeout_s
    operator = (
        open_token_store(s.url, a.tokens_path(data), "operator", connect_timeout_s=timeout) if a.enabled else None
    )
    node = (
        open_token_store(s.url, a.node_tokens_path(data), "node", connect_timeout_s=timeout)
        if a.nodes_required
        else None
    )
    return operator, node


def open_blobs(settings: BlobSettings, root: Path) -> ChunkBlobs:
    """The chunk store the settings name: an S3 bucket, or the directory ``root``."""
    if settings.bucket is None:
        return BlobStore(root)
    from central.storage.blobs.s3 import S3BlobStore  # obstore only where S3 is configured

    return S3BlobStore.connect(
        bucket=settings.bucket,
        endpoint=settings.s3_endpoint,
        region=settings.region,
        access_key=settings.access_key.get_secret_value() if settings.access_key else None,
        secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
        prefix=settings.prefix,
        grace_s=settings.gc_grace_s,
    )
