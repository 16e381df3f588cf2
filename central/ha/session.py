"""The SQL of a replica's control session: one dedicated PostgreSQL connection whose
session-level advisory locks *are* the replica's leadership and partition ownership.

Kept apart from the tick logic (``control.py``) so that every statement a tick may send is
here, in one place, each batched: a tick in the steady state is three short round trips,
whatever the number of partitions."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import psycopg

#: Advisory lock keys live in one 64-bit space per database; these share the "mflt" prefix
#: of ``storage.postgres.migrate.MIGRATION_LOCK_KEY`` and never collide with it.
LEADER_KEY = 0x6D666C74_6C656164  # "mflt" "lead"
#: Partition ``k`` is locked under ``PARTITION_BASE + k`` (k < 4096, settings enforce it).
PARTITION_BASE = 0x6D666C74_70000000  # "mflt" "p\0\0\0"
#: Control sessions call themselves this plus the replica id, so that a backend pid recorded in
#: ``ha_replicas`` is only trusted (or terminated) while it still belongs to that replica's session,
#: never when PostgreSQL has reused the pid for another connection.
APPLICATION_PREFIX = "modelfleet-ha/"
#: PostgreSQL keeps at most NAMEDATALEN - 1 bytes of application_name.
_APPLICATION_NAME_MAX = 63

_OWN_SESSION = f"a.pid = r.backend_pid AND a.application_name = left('{APPLICATION_PREFIX}' || r.replica_id, 63)"

# Before presence: end the sessions of replicas not seen for a TTL (hung, paused, cut off: their
# locks would otherwise stay held for as long as their TCP connection lingers) and forget rows
# long gone. Runs first so that a replica reconnecting can clear its own lingering old session.
_REAP = f"""
WITH gone AS (
    DELETE FROM ha_replicas WHERE seen_at < now() - make_interval(secs => %(forget_s)s)
)
SELECT r.replica_id, pg_terminate_backend(a.pid)
FROM ha_replicas r JOIN pg_stat_activity a ON {_OWN_SESSION}
WHERE r.seen_at < now() - make_interval(secs => %(ttl_s)s) AND r.backend_pid <> pg_backend_pid()
"""

# Refuses (no row back) to take over the row of a replica id whose recorded session is still
# alive and is not this one: two processes started with the same replica id.
_PRESENCE = f"""
INSERT INTO ha_replicas AS r (replica_id, http_url, grpc_address, backend_pid, started_at, seen_at, info)
VALUES (%(id)s, %(http)s, %(grpc)s, pg_backend_pid(), to_timestamp(%(started)s), now(), %(info)s::jsonb)
ON CONFLICT (replica_id) DO UPDATE SET
    http_url = EXCLUDED.http_url, grpc_address = EXCLUDED.grpc_address, backend_pid = EXCLUDED.backend_pid,
    started_at = EXCLUDED.started_at, seen_at = EXCLUDED.seen_at, info = EXCLUDED.info
WHERE r.backend_pid = EXCLUDED.backend_pid
   OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE {_OWN_SESSION})
RETURNING 1
"""

_LIVE = f"""
SELECT r.replica_id, r.http_url, r.grpc_address, r.info,
       extract(epoch FROM r.started_at)::float8, extract(epoch FROM now() - r.seen_at)::float8,
       (SELECT l.replica_id FROM ha_leader l WHERE l.id = 1)
FROM ha_replicas r JOIN pg_stat_activity a ON {_OWN_SESSION}
WHERE r.seen_at > now() - make_interval(secs => %(ttl_s)s)
ORDER BY r.replica_id
"""

_TRY_LEADER = "SELECT pg_try_advisory_lock(%s::bigint)"
_BUMP_LEADER = "UPDATE ha_leader SET epoch = epoch + 1, replica_id = %s, since = now() WHERE id = 1 RETURNING epoch"
_TRY_PARTITIONS = "SELECT k, pg_try_advisory_lock(%s::bigint + k) FROM unnest(%s::int[]) AS k"
_BUMP_PARTITIONS = """
INSERT INTO ha_partitions AS p (partition, epoch, replica_id, since)
SELECT k, 1, %s, now() FROM unnest(%s::int[]) AS k
ON CONFLICT (partition) DO UPDATE SET epoch = p.epoch + 1, replica_id = EXCLUDED.replica_id, since = EXCLUDED.since
RETURNING partition, epoch
"""
_UNLOCK_PARTITIONS = "SELECT pg_advisory_unlock(%s::bigint + k) FROM unnest(%s::int[]) AS k"
_LEAVE = "DELETE FROM ha_replicas WHERE replica_id = %s AND backend_pid = pg_backend_pid()"
_UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"


class ReplicaIdInUse(RuntimeError):
    """Another live control session is registered under this replica id (two processes were given
    the same ``ha.replica_id``); this one holds nothing until that session is gone."""


@dataclass(frozen=True)
class ReplicaRow:
    """One live row of ``ha_replicas`` with the current leader's id, as the tick reads them."""

    replica_id: str
    http_url: str
    grpc_address: str
    info: dict[str, Any]
    started_at: float
    seen_age_s: float
    leader_id: str | None


def application_name(replica_id: str) -> str:
    """The application_name of ``replica_id``'s control session, as PostgreSQL stores it."""
    return (APPLICATION_PREFIX + replica_id)[:_APPLICATION_NAME_MAX]


async def connect(url: str, replica_id: str, *, ttl_s: float, connect_timeout_s: float) -> psycopg.AsyncConnection:
    """A new autocommit control connection. TCP keepalives and a user timeout make a dead link
    fail within about a TTL instead of the kernel's two hours; a statement timeout bounds a tick
    stuck behind a lock (e.g. an epoch bump waiting on a fenced write that never ends)."""
    idle = max(1, math.ceil(ttl_s / 3))
    conn = await psycopg.AsyncConnection.connect(
        url,
        autocommit=True,
        connect_timeout=max(2, math.ceil(connect_timeout_s)),
        application_name=application_name(replica_id),
        keepalives=1,
        keepalives_idle=idle,
        keepalives_interval=idle,
        keepalives_count=3,
        tcp_user_timeout=max(1000, math.ceil(ttl_s * 1000)),
    )
    try:
        await conn.execute(f"SET statement_timeout = {max(1000, math.ceil(ttl_s * 1000))}".encode())
    except BaseException:
        await conn.close()
        raise
    return conn


async def reap(conn: psycopg.AsyncConnection, *, ttl_s: float, forget_s: float) -> list[str]:
    """End stale replicas' sessions and forget long-gone rows; returns the ids whose session was ended."""
    cur = await conn.execute(_REAP, {"ttl_s": ttl_s, "forget_s": forget_s})
    return [str(row[0]) for row in await cur.fetchall()]


async def renew_presence(
    conn: psycopg.AsyncConnection,
    replica_id: str,
    *,
    http_url: str,
    grpc_address: str,
    started_at: float,
    info: dict[str, Any],
) -> None:
    """Upsert this replica's row (seen now, on this session's pid); raise :class:`ReplicaIdInUse`
    when another live session owns the id."""
    params = {
        "id": replica_id,
        "http": http_url,
        "grpc": grpc_address,
        "started": started_at,
        "info": json.dumps(info),
    }
    cur = await conn.execute(_PRESENCE, params)
    if await cur.fetchone() is None:
        raise ReplicaIdInUse(f"replica id {replica_id!r} is in use by another live central")


async def live_replicas(conn: psycopg.AsyncConnection, *, ttl_s: float) -> list[ReplicaRow]:
    """Replicas whose control session is open and that were seen within ``ttl_s``, by id."""
    cur = await conn.execute(_LIVE, {"ttl_s": ttl_s})
    return [
        ReplicaRow(str(r[0]), str(r[1]), str(r[2]), dict(r[3] or {}), float(r[4]), float(r[5]), r[6])
        for r in await cur.fetchall()
    ]


async def try_leadership(conn: psycopg.AsyncConnection, replica_id: str) -> int | None:
    """Take the leader lock if it is free and return the new leader epoch; None if another holds it."""
    cur = await conn.execute(_TRY_LEADER, (LEADER_KEY,))
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    cur = await conn.execute(_BUMP_LEADER, (replica_id,))
    bumped = await cur.fetchone()
    if bumped is None:
        raise psycopg.DataError("ha_leader has no row: is migration 0003 applied?")
    return int(bumped[0])


async def try_partitions(conn: psycopg.AsyncConnection, replica_id: str, wanted: list[int]) -> dict[int, int]:
    """Try the locks of ``wanted`` in one statement; bump the epoch of those taken (one more).
    Returns partition -> new epoch for the partitions now held."""
    if not wanted:
        return {}
    cur = await conn.execute(_TRY_PARTITIONS, (PARTITION_BASE, wanted))
    got = [int(k) for k, ok in await cur.fetchall() if ok]
    if not got:
        return {}
    cur = await conn.execute(_BUMP_PARTITIONS, (replica_id, got))
    return {int(k): int(epoch) for k, epoch in await cur.fetchall()}


async def release_partitions(conn: psycopg.AsyncConnection, partitions: list[int]) -> None:
    """Unlock ``partitions`` (held by this session) in one statement."""
    if partitions:
        await conn.execute(_UNLOCK_PARTITIONS, (PARTITION_BASE, partitions))


async def leave(conn: psycopg.AsyncConnection, replica_id: str) -> None:
    """Delete this replica's row (if still ours) and release every advisory lock of the session."""
    await conn.execute(_LEAVE, (replica_id,))
    await conn.execute(_UNLOCK_ALL)
