"""A migrated database for the control-session tests (central's stores migrate it the same way)."""

from __future__ import annotations

import psycopg
import pytest

from central.registry.pg_migrations import apply_migrations


@pytest.fixture
def ha_url(postgres_url: str) -> str:
    """``postgres_url`` with central's migrations (``ha_leader``, ``ha_partitions``, ``ha_replicas``) applied."""
    with psycopg.connect(postgres_url) as conn:
        apply_migrations(conn)
    return postgres_url
