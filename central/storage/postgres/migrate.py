"""PostgreSQL schema migrations kept in the repo (``central/storage/postgres/migrations/NNNN_*.sql``).

Every replica applies them at start. All of it runs in one transaction that first takes a
transaction-scoped advisory lock, so replicas starting together queue behind each other: the
first applies what is missing, the others then find it recorded in ``schema_migrations``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

#: Shipped as package data (pyproject's ``[tool.setuptools.package-data]``).
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: The advisory lock key of registry migrations (any constant shared by all replicas).
MIGRATION_LOCK_KEY = 0x6D666C74_6D696772  # "mflt" "migr"

_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version TEXT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One SQL file: its version (the file name without ``.sql``) and its text."""

    version: str
    sql: str


def bundled_migrations() -> list[Migration]:
    """The migrations shipped with central, in file-name order."""
    files = sorted(MIGRATIONS_DIR.glob("*.sql"))
    return [Migration(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in files]


def apply_migrations(conn: psycopg.Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Apply the migrations not yet recorded, in one transaction under the advisory lock;
    returns the versions this call applied (empty when another replica got there first)."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(_TABLE)
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for migration in migrations if migrations is not None else bundled_migrations():
            if migration.version in done:
                continue
            conn.execute(migration.sql.encode())  # no parameters: several statements may run
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (migration.version,))
            applied.append(migration.version)
    return applied
