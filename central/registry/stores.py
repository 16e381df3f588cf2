"""Opens the metadata store the settings ask for: SQLite in the data dir, or PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from central.registry.sqlite_impl import SQLiteMetadataStore
from central.registry.store import MetadataStore
from central.settings import StoreSettings


def open_metadata_store(settings: StoreSettings, sqlite_path: Path) -> MetadataStore:
    """PostgreSQL when ``settings.url`` is set (migrated on open), else SQLite at ``sqlite_path``."""
    if settings.url is None:
        return SQLiteMetadataStore(sqlite_path)
    # Imported only here: psycopg is the [postgres] extra, which a SQLite central does not need.
    try:
        from central.registry.postgres_impl import PostgresMetadataStore
    except ImportError as exc:
        raise RuntimeError(
            "store.url (PostgreSQL) needs the postgres extra: pip install 'modelfleet[postgres]'"
        ) from exc
    return PostgresMetadataStore(
        settings.url, pool_size=settings.pool_size, connect_timeout_s=settings.connect_timeout_s
    )
