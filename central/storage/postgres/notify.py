"""The fleet generation every replica follows (``ha_generation``, migration 0003): a write that
other replicas must re-read bumps it and NOTIFYs ``CHANNEL`` in its own transaction, so the
wake-up is sent at its commit and never for a write that rolled back (``central.ha.generation``
listens, and polls the number anyway)."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["CHANNEL", "bump_config"]

#: The NOTIFY channel; its payload is the new generation (a wake-up only, never the data).
CHANNEL = "modelfleet_fleet"

_BUMP_CONFIG = (
    "WITH b AS (UPDATE ha_generation SET gen = gen + 1, config_gen = config_gen + 1 WHERE id = 1 RETURNING gen)"
    " SELECT gen, pg_notify(%s, gen::text) FROM b"
)


def bump_config(conn: psycopg.Connection[Any]) -> int:
    """+1 on the generation and the configuration generation (every replica re-reads the
    registry, rollouts and decisions), inside the caller's transaction; the new generation."""
    row = conn.execute(_BUMP_CONFIG, (CHANNEL,)).fetchone()
    assert row is not None, "ha_generation has its one row (migration 0003)"
    return int(row[0])
