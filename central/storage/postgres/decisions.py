"""Central's decisions beyond versions and rollouts on PostgreSQL (``decisions``, migration
0005), shared by replicas: INT8 drift flags and fallbacks, clear baselines, artifact verdicts,
the transfer policy.

Every write bumps the configuration generation in its transaction, so every replica re-reads
them (``central.ha.replica``). A leader's decision carries its epoch and is fenced like the
placement (``central.ha.fencing``): the epoch row is read ``FOR SHARE`` first, so a deposed
leader's late write is refused, and an election waits for a write already under way. Lock
order as in ``fleet_store``: the epoch row, then ``ha_generation``, then the records."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from psycopg.types.json import Jsonb

from central.ha.fencing import check_leader_epoch
from central.storage.postgres.notify import bump_config
from central.storage.postgres.pool import open_pool

__all__ = ["PostgresDecisionStore"]

_UPSERT = (
    "INSERT INTO decisions (kind, key, body, epoch) VALUES (%s, %s, %s, %s) ON CONFLICT (kind, key)"
    " DO UPDATE SET body = EXCLUDED.body, epoch = EXCLUDED.epoch, written_at = now()"
)


class PostgresDecisionStore:
    """``DecisionRecords`` on PostgreSQL; thread-safe (each call borrows a pooled connection)."""

    def __init__(self, url: str, *, pool_size: int = 2, connect_timeout_s: float = 10.0) -> None:
        self._pool, _ = open_pool(url, name="decisions", pool_size=pool_size, connect_timeout_s=connect_timeout_s)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def load(self, kind: str) -> dict[str, Any]:
        """Every record of ``kind``."""
        with self._pool.connection() as conn:
            rows = conn.execute("SELECT key, body FROM decisions WHERE kind = %s", (kind,)).fetchall()
        return {str(r[0]): r[1] for r in rows}

    def write(
        self,
        kind: str,
        puts: Mapping[str, Any],
        deletes: Iterable[str] = (),
        *,
        fence: int | None = None,
        also: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Upsert and delete in one transaction, fenced by ``fence`` when given (``Fenced``)."""
        rows = [(kind, k, Jsonb(_plain(v)), fence) for k, v in puts.items()]
        rows += [(k2, k, Jsonb(_plain(v)), fence) for k2, records in (also or {}).items() for k, v in records.items()]
        gone = list(deletes)
        with self._pool.connection() as conn, conn.transaction():
            if fence is not None:
                check_leader_epoch(conn, fence)
            bump_config(conn)
            if gone:
                conn.execute("DELETE FROM decisions WHERE kind = %s AND key = ANY(%s)", (kind, gone))
            if rows:
                with conn.cursor() as cur:
                    cur.executemany(_UPSERT, rows)

    def add(self, kind: str, key: str, body: Any) -> bool:
        """First wins: the database, not the replicas, says which of two racing records stays."""
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.execute(
                "INSERT INTO decisions (kind, key, body) VALUES (%s, %s, %s) ON CONFLICT (kind, key) DO NOTHING",
                (kind, key, Jsonb(_plain(body))),
            )
            if not cur.rowcount:
                return False
            bump_config(conn)
            return True


def _plain(body: Any) -> Any:
    """``body`` as plain JSON values (tuples become lists, as they come back)."""
    return json.loads(json.dumps(body))
