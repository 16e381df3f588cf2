"""A one-time import of the three SQLite files an older central kept in its data dir
(``registry.sqlite3``, ``rollouts.sqlite3``, ``events.sqlite3``) into ``central.sqlite3``, so an
existing data dir keeps its models, rollouts and events.

Each old file is copied in one transaction (``INSERT OR IGNORE``: rows already there stay) and
then renamed to ``<name>.imported``, which keeps it as a backup and stops the import from
running again. A crash between the commit and the rename repeats the import at the next start,
which then changes nothing."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from central.storage.sqlite.database import SQLiteDatabase
from central.storage.sqlite.events import SQLiteJournalDB
from central.storage.sqlite.registry import SQLiteMetadataStore
from central.storage.sqlite.rollouts import SQLiteRolloutStore

log = logging.getLogger(__name__)

__all__ = ["LEGACY_REGISTRY", "import_legacy_files"]

#: The registry file of an older central (its presence also means "not a fresh data dir").
LEGACY_REGISTRY = "registry.sqlite3"

#: Old file -> (old table, new table) pairs, in an order that satisfies foreign keys.
_LEGACY_TABLES: dict[str, list[tuple[str, str]]] = {
    LEGACY_REGISTRY: [("models", "models"), ("versions", "versions")],
    "rollouts.sqlite3": [("releases", "releases"), ("rollouts", "rollouts")],
    "events.sqlite3": [("events", "events"), ("meta", "events_meta")],
}

#: What the rename appends to an imported file (and its WAL files, when any were left).
_SUFFIX = ".imported"


def import_legacy_files(path: Path, data_dir: Path) -> list[str]:
    """Import every old file found in ``data_dir`` into the database file ``path``; returns the
    names of the files imported (empty for a new data dir or one imported before)."""
    found = [name for name in _LEGACY_TABLES if (data_dir / name).exists()]
    if not found:
        return []
    db = SQLiteDatabase(path).acquire()  # held by the import: the stores' closes leave it open
    try:
        _create_tables(db)
        for name in found:
            copied = _import_file(db, data_dir / name, _LEGACY_TABLES[name])
            _rename(data_dir / name)
            log.info("imported %s into %s (%s); the old file is kept as %s%s", name, path.name, copied, name, _SUFFIX)
    finally:
        db.close()
    return found


def _create_tables(db: SQLiteDatabase) -> None:
    """The new file's tables, made by the stores that own them."""
    for store in (SQLiteMetadataStore(db), SQLiteRolloutStore(db), SQLiteJournalDB(db)):
        store.close()


def _import_file(db: SQLiteDatabase, old: Path, tables: list[tuple[str, str]]) -> str:
    """Copy ``tables`` of ``old`` in one transaction; a summary of the rows copied."""
    db.execute("ATTACH DATABASE ? AS legacy", (str(old),))
    try:
        counts = []
        with db.transaction() as conn:
            for source, target in tables:
                counts.append(f"{target}: {_copy(conn, source, target)}")
        return ", ".join(counts)
    finally:
        db.execute("DETACH DATABASE legacy")


def _copy(conn: sqlite3.Connection, source: str, target: str) -> int:
    """Insert the rows of ``legacy.source`` missing from ``main.target`` (shared columns only:
    an old registry may lack a later column, which then takes its default); rows copied."""
    old = {row[1] for row in conn.execute(f"PRAGMA legacy.table_info({source})")}
    if not old:
        return 0
    new = [row[1] for row in conn.execute(f"PRAGMA main.table_info({target})")]
    columns = ", ".join(c for c in new if c in old)
    cur = conn.execute(f"INSERT OR IGNORE INTO main.{target} ({columns}) SELECT {columns} FROM legacy.{source}")
    return cur.rowcount


def _rename(old: Path) -> None:
    """``old`` (and any WAL files left beside it) to ``<name>.imported``."""
    for suffix in ("", "-wal", "-shm"):
        part = old.with_name(old.name + suffix)
        if part.exists():
            part.rename(old.with_name(old.name + _SUFFIX + suffix))
