"""The fleet state every central replica routes and places from, kept in PostgreSQL so that any
replica can take any call: edge registrations (``ha_nodes``), liveness and the models each node reports
(``ha_liveness``, written by the owner of the node's heartbeat partition) and the leader's
placement (``ha_placement``).

Every change bumps ``ha_generation.gen`` and NOTIFYs ``modelfleet_fleet`` in the same
transaction, so a replica that sees a generation also sees every write up to it, and a
replica that slept re-reads only when the number moved (``snapshot(since_gen=...)``).

Liveness and placement writes are fenced: they take the writer's epoch row (``ha_partitions``
or ``ha_leader``) ``FOR SHARE`` and check it in the same transaction. An election that bumps
the epoch must wait for a write holding that lock, and a write that comes after the election
reads the new epoch and fails with ``Fenced``; a deposed owner can never overwrite its
successor. Lock order in every write: the epoch row, then ``ha_generation``, then data rows,
so two writers never wait on each other in a cycle."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from central.ha.fencing import check_leader_epoch, check_partition_epoch
from central.storage.postgres.notify import CHANNEL
from central.storage.postgres.pool import masked_url, open_pool

_log = logging.getLogger(__name__)

__all__ = ["CHANNEL", "LIVENESS_STATES", "FleetChanges", "FleetSnapshot", "FleetStore", "LivenessRow"]

#: What a partition owner may say about a node.
LIVENESS_STATES = frozenset({"alive", "suspect", "dead"})

# One statement, one round trip: the NOTIFY is queued in the bumping transaction and delivered
# at its commit, never for a write that rolled back.
_BUMP = (
    "WITH b AS (UPDATE ha_generation SET gen = gen + 1 WHERE id = 1 RETURNING gen)"
    " SELECT gen, pg_notify(%s, gen::text) FROM b"
)
_UPSERT_LIVENESS = (
    "INSERT INTO ha_liveness (node_id, partition, state, http_address, models, gen, clock)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (node_id) DO UPDATE SET partition = EXCLUDED.partition,"
    " state = EXCLUDED.state, http_address = EXCLUDED.http_address, models = EXCLUDED.models, gen = EXCLUDED.gen,"
    " clock = EXCLUDED.clock"
)


@dataclass(frozen=True)
class LivenessRow:
    """What the owner of ``partition`` last decided about one node."""

    node_id: str
    partition: int
    state: str
    """``alive``, ``suspect`` or ``dead``."""
    http_address: str
    models: tuple[dict[str, Any], ...]
    """The models the node last reported: ``name``, ``version``, ``state`` and ``error`` of each
    (what routing and rollouts decide from; not its counters, which change every beat)."""
    clock: tuple[float, float] | None = None
    """``(offset_ms, error_ms)`` of central's clock against the node's; None: unknown."""

    def __post_init__(self) -> None:
        if self.state not in LIVENESS_STATES:
            raise ValueError(f"liveness state {self.state!r} is not one of {sorted(LIVENESS_STATES)}")


@dataclass(frozen=True)
class FleetSnapshot:
    """The whole fleet state as of generation ``gen``, read in one REPEATABLE READ transaction,
    so a replica never routes from registrations of one moment and liveness of another."""

    gen: int
    nodes: dict[str, dict[str, Any]]
    liveness: dict[str, LivenessRow]
    placement: dict[str, Any] | None
    placement_epoch: int | None


@dataclass(frozen=True)
class FleetChanges:
    """What changed in the fleet state after some generation, as of generation ``gen``."""

    gen: int
    config_gen: int
    """Grows only with ``bump``: a change in the registry or the rollouts (not in liveness)."""
    nodes: dict[str, dict[str, Any]]
    """Registrations written since (new or changed)."""
    node_ids: set[str]
    """Every registered node now (a registration missing here was removed)."""
    liveness: dict[str, LivenessRow]
    """Liveness rows written since."""
    placement: dict[str, Any] | None
    """The leader's placement, when it was written since."""
    placement_epoch: int | None


def _bump(conn: psycopg.Connection[Any]) -> int:
    """+1 on the generation and queue its NOTIFY, inside the caller's transaction."""
    row = conn.execute(_BUMP, (CHANNEL,)).fetchone()
    assert row is not None, "ha_generation has its one row (migration 0003)"
    return int(row[0])


def _current_gen(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT gen FROM ha_generation WHERE id = 1").fetchone()
    assert row is not None, "ha_generation has its one row (migration 0003)"
    return int(row[0])


def _clock(row: LivenessRow) -> Jsonb | None:
    return Jsonb(list(row.clock)) if row.clock is not None else None


def _liveness(row: tuple[Any, ...]) -> LivenessRow:
    models = tuple(dict(m) for m in row[4])
    clock = (float(row[5][0]), float(row[5][1])) if isinstance(row[5], list) and len(row[5]) == 2 else None
    return LivenessRow(str(row[0]), int(row[1]), str(row[2]), str(row[3]), models, clock)


class FleetStore:
    """Reads and writes of the shared fleet state; thread-safe (each call borrows a pooled
    connection). Every write returns the generation it produced."""

    def __init__(self, url: str, *, pool_size: int = 4, connect_timeout_s: float = 10.0) -> None:
        self._pool, applied = open_pool(
            url, name="modelfleet-fleet", pool_size=pool_size, connect_timeout_s=connect_timeout_s
        )
        _log.info("fleet state on PostgreSQL %s; migrations applied now: %s", masked_url(url), applied or "none")

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection for a one-off job (e.g. agreeing on the signing key at start)."""
        return self._pool.connection()

    def generation(self) -> int:
        """The current fleet generation."""
        with self._pool.connection() as conn:
            return _current_gen(conn)

    def bump(self) -> int:
        """Tell every replica to re-read (e.g. after a push or a rollout change that lives in
        other tables); returns the new generation."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("UPDATE ha_generation SET config_gen = config_gen + 1 WHERE id = 1")
            return _bump(conn)

    def put_node(self, node_id: str, record: dict[str, Any]) -> int:
        """Insert or replace a node's registration (any replica may take a Register call)."""
        with self._pool.connection() as conn, conn.transaction():
            gen = _bump(conn)
            conn.execute(
                "INSERT INTO ha_nodes (node_id, record, gen) VALUES (%s, %s, %s)"
                " ON CONFLICT (node_id) DO UPDATE SET record = EXCLUDED.record, gen = EXCLUDED.gen",
                (node_id, Jsonb(record), gen),
            )
            return gen

    def remove_node(self, node_id: str) -> int | None:
        """Drop a registration; None (and no bump, nobody woken) when the node is unknown. Its
        liveness row stays until the partition owner forgets it (only the owner writes it)."""
        with self._pool.connection() as conn, conn.transaction() as tx:
            gen = _bump(conn)
            if conn.execute("DELETE FROM ha_nodes WHERE node_id = %s", (node_id,)).rowcount:
                return gen
            raise psycopg.Rollback(tx)  # takes the bump and its NOTIFY back
        return None

    def put_liveness(self, partition: int, epoch: int, rows: Sequence[LivenessRow]) -> int:
        """Upsert liveness rows as the owner of ``partition`` at ``epoch``; raises ``Fenced``
        if that is no longer this writer's epoch. Rows of other partitions are skipped: a
        partition's owner speaks only for its own nodes. Nothing to write: no bump."""
        mine = [r for r in rows if r.partition == partition]
        with self._pool.connection() as conn, conn.transaction():
            check_partition_epoch(conn, partition, epoch)
            if not mine:
                return _current_gen(conn)
            gen = _bump(conn)
            with conn.cursor() as cur:
                cur.executemany(
                    _UPSERT_LIVENESS,
                    [
                        (r.node_id, r.partition, r.state, r.http_address, Jsonb(list(r.models)), gen, _clock(r))
                        for r in mine
                    ],
                )
            return gen

    def forget_liveness(self, partition: int, epoch: int, node_ids: Sequence[str]) -> int:
        """Delete liveness rows of ``partition`` (fenced like ``put_liveness``); returns the new
        generation, or the one before the call when none of the nodes had a row (no bump)."""
        with self._pool.connection() as conn, conn.transaction() as tx:
            check_partition_epoch(conn, partition, epoch)
            gen = _bump(conn)
            cur = conn.execute(
                "DELETE FROM ha_liveness WHERE partition = %s AND node_id = ANY(%s)", (partition, list(node_ids))
            )
            if cur.rowcount:
                return gen
            raise psycopg.Rollback(tx)
        # We held ha_generation's row lock, so gen - 1 was the committed generation then.
        return gen - 1

    def put_placement(self, epoch: int, body: dict[str, Any]) -> int:
        """Store the leader's placement; raises ``Fenced`` unless ``epoch`` is still the
        leader epoch, so a deposed leader's late write never replaces its successor's."""
        with self._pool.connection() as conn, conn.transaction():
            check_leader_epoch(conn, epoch)
            gen = _bump(conn)
            conn.execute(
                "INSERT INTO ha_placement (id, epoch, gen, body) VALUES (1, %s, %s, %s) ON CONFLICT (id)"
                " DO UPDATE SET epoch = EXCLUDED.epoch, gen = EXCLUDED.gen, body = EXCLUDED.body",
                (epoch, gen, Jsonb(body)),
            )
            return gen

    def snapshot(self, since_gen: int | None = None) -> FleetSnapshot | None:
        """Everything, as of one generation; None when it still is ``since_gen`` (then only
        the generation was read, so polling an idle fleet costs one small query)."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            gen = _current_gen(conn)
            if gen == since_gen:
                return None
            nodes = {str(r[0]): dict(r[1]) for r in conn.execute("SELECT node_id, record FROM ha_nodes")}
            liveness = {
                str(r[0]): _liveness(r)
                for r in conn.execute("SELECT node_id, partition, state, http_address, models, clock FROM ha_liveness")
            }
            placement = conn.execute("SELECT body, epoch FROM ha_placement WHERE id = 1").fetchone()
        if placement is None:
            return FleetSnapshot(gen, nodes, liveness, None, None)
        return FleetSnapshot(gen, nodes, liveness, dict(placement[0]), int(placement[1]))

    def changes(self, since_gen: int) -> FleetChanges | None:
        """What changed after ``since_gen``, in one consistent read: the rows written since (every
        row carries the generation of its last write), and the ids of every registration, so a
        removal shows. None when nothing did. A replica reads this at every wake-up instead of
        the whole fleet: 10,000 liveness rows re-read ten times a second would be its main load."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT gen, config_gen FROM ha_generation WHERE id = 1").fetchone()
            assert row is not None, "ha_generation has its one row (migration 0003)"
            gen, config_gen = int(row[0]), int(row[1])
            if gen == since_gen:
                return None
            nodes = {
                str(r[0]): dict(r[1])
                for r in conn.execute("SELECT node_id, record FROM ha_nodes WHERE gen > %s", (since_gen,))
            }
            node_ids = {str(r[0]) for r in conn.execute("SELECT node_id FROM ha_nodes")}
            liveness = {
                str(r[0]): _liveness(r)
                for r in conn.execute(
                    "SELECT node_id, partition, state, http_address, models, clock FROM ha_liveness WHERE gen > %s",
                    (since_gen,),
                )
            }
            placement = conn.execute("SELECT body, epoch FROM ha_placement WHERE id = 1 AND gen > %s", (since_gen,))
            row = placement.fetchone()
        body, epoch = (dict(row[0]), int(row[1])) if row is not None else (None, None)
        return FleetChanges(gen, config_gen, nodes, node_ids, liveness, body, epoch)
