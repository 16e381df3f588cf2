"""Rollouts and release pointers on PostgreSQL (``store.url``), so central replicas share
them. Same semantics as ``SQLiteRolloutStore``: ids only grow (a sequence), a rollout
is stored whole as JSON with its state beside it, ``epoch`` is the highest rollout id a
plain push superseded.

Replicas write rollouts too, so every update names the revision (``rev``) this store last read
or wrote of the row and bumps it: a write decided on a stale read is refused
(``StaleRollout``), never the later of two racing writes silently winning. The leader's
controller also passes its epoch (``fence``), checked in the same transaction as the
placement's (``central.ha.fencing``): a deposed leader's pass writes nothing."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from central.ha.fencing import check_leader_epoch
from central.rollout.model import Rollout
from central.storage.postgres.notify import bump_config
from central.storage.postgres.pool import open_pool
from central.storage.postgres.shared import SharedTransaction
from central.storage.protocols import Release, StaleRollout


class PostgresRolloutStore:
    """``RolloutRecords`` on PostgreSQL; thread-safe (each call borrows a pooled connection)."""

    def __init__(
        self, url: str, *, pool_size: int = 4, connect_timeout_s: float = 10.0, shared: SharedTransaction | None = None
    ) -> None:
        """``shared``: the transactions (a push's, opened by the registry store) this store's writes join."""
        self._shared = shared or SharedTransaction()
        self._pool, _ = open_pool(url, name="rollouts", pool_size=pool_size, connect_timeout_s=connect_timeout_s)
        #: Rollout id -> the revision this store last read or wrote (what an update expects).
        self._revs: dict[int, int] = {}

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def releases(self) -> dict[str, Release]:
        """Every model's release pointer, by model."""
        rows = self._query("SELECT model, stable, epoch FROM releases")
        return {r[0]: Release(r[0], r[1], int(r[2])) for r in rows}

    def set_release(self, model: str, stable: str | None, epoch: int) -> None:
        """Point ``model`` at ``stable``; rollouts with an id up to ``epoch`` no longer apply."""
        with self._shared.connection(self._pool) as conn:
            conn.execute(
                "INSERT INTO releases (model, stable, epoch) VALUES (%s, %s, %s)"
                " ON CONFLICT (model) DO UPDATE SET stable = excluded.stable, epoch = excluded.epoch",
                (model, stable, epoch),
            )

    def insert(self, rollout: Rollout) -> Rollout:
        """Store a new rollout; returns it with its id (one transaction)."""
        with self._shared.connection(self._pool) as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO rollouts (model, state, body) VALUES (%s, %s, '{}') RETURNING id",
                (rollout.model, rollout.state),
            ).fetchone()
            assert row is not None
            stored = rollout.model_copy(update={"id": int(row[0])})
            conn.execute(
                "UPDATE rollouts SET body = %s WHERE id = %s", (Jsonb(stored.model_dump(mode="json")), stored.id)
            )
        self._revs[stored.id] = 0
        return stored

    def update(self, rollout: Rollout, fence: int | None = None) -> None:
        """Persist a rollout's new state and progress: refused (``StaleRollout``) when another
        writer changed it since this store read it, and (``Fenced``) when ``fence`` is given and
        is no longer the leader epoch. Bumps the configuration generation with it: every
        replica re-reads the rollouts then, and only then."""
        rev = self._revs.get(rollout.id, 0)
        with self._shared.connection(self._pool) as conn, conn.transaction():
            if fence is not None:
                check_leader_epoch(conn, fence)
            bump_config(conn)
            cur = conn.execute(
                "UPDATE rollouts SET state = %s, body = %s, rev = rev + 1 WHERE id = %s AND rev = %s",
                (rollout.state, Jsonb(rollout.model_dump(mode="json")), rollout.id, rev),
            )
            if not cur.rowcount:
                raise StaleRollout(
                    f"rollout {rollout.id} of {rollout.model} changed on another replica meanwhile; nothing written"
                )
        self._revs[rollout.id] = rev + 1

    def all(self) -> list[Rollout]:
        """Every rollout, oldest first (and the revision of each, which later updates expect)."""
        rows = self._query("SELECT body, id, rev FROM rollouts ORDER BY id")
        self._revs = {int(r[1]): int(r[2]) for r in rows}
        return [Rollout.model_validate(r[0]) for r in rows]

    def max_id(self, model: str) -> int:
        """The highest rollout id of ``model`` (0 when none)."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM rollouts WHERE model = %s", (model,))[0][0])

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._shared.connection(self._pool) as conn:
            return conn.execute(sql, args).fetchall()
