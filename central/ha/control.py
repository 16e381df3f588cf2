"""A replica's control session: who leads, which heartbeat partitions this replica owns, and
which replicas are up, kept in step with PostgreSQL every ``tick_s``.

Leadership and partition ownership are session-level advisory locks on one dedicated
connection (``session.py``), so they end exactly when PostgreSQL closes that session: a
replica killed with SIGKILL loses them at once, a hung one when a peer ends its session a
TTL after it was last seen. Each takeover bumps an epoch that fences the stale owner's
writes (``fencing.py``). The listener hears every change on the event loop, and always
hears of a loss before the lock is released, so it can stop writing first."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psycopg

from central.ha import session
from central.ha.rendezvous import partitions_of
from central.storage.postgres.pool import masked_url

log = logging.getLogger(__name__)

#: Reconnect delays after a lost session double from one tick up to this cap, so a replica rejoins
#: within about two seconds of the database coming back. Never sooner than a tick: the peers, who
#: saw the session end, take over its roles on their next tick; a replica racing back faster would
#: only make its partitions flap.
_BACKOFF_MAX_S = 2.0
#: Rows of replicas gone this many TTLs are deleted (kept a while only for people looking).
_FORGET_TTLS = 10
#: What a lost, refused or stuck control session raises; the replica then holds nothing.
_SESSION_ERRORS = (psycopg.Error, OSError, TimeoutError, session.ReplicaIdInUse)


@dataclass(frozen=True)
class ReplicaInfo:
    """One live replica as of the last tick (a row of ``ha_replicas``)."""

    replica_id: str
    http_url: str
    grpc_address: str
    leader: bool
    partitions: list[int]
    started_at: float
    """Unix time the replica's control object was made."""
    seen_age_s: float
    """Seconds since the replica last renewed its row, as PostgreSQL measured at the last tick."""


class ControlListener(Protocol):
    """What a replica does when its roles change; called on the event loop, never concurrently."""

    def leadership_gained(self, epoch: int) -> None:
        """This replica leads from now on; writes as leader carry ``epoch``."""

    def leadership_lost(self) -> None:
        """This replica no longer leads (stop, lost session): stop leader work now."""

    def partitions_gained(self, gained: dict[int, int]) -> None:
        """These partitions (-> their new epochs) are this replica's from now on."""

    def partitions_released(self, released: set[int]) -> None:
        """These partitions are no longer this replica's: stop writing for them now."""


class ControlUnavailable(RuntimeError):
    """The control session could not be set up at start-up (database unreachable, replica id in use)."""


class ReplicaControl:
    """Holds one replica's leadership and partition locks on a dedicated PostgreSQL session."""

    def __init__(
        self,
        url: str,
        replica_id: str,
        *,
        http_url: str,
        grpc_address: str,
        partitions: int,
        ttl_s: float,
        tick_s: float,
        connect_timeout_s: float,
        listener: ControlListener,
    ) -> None:
        self._url = url
        self.replica_id = replica_id
        self._http_url = http_url
        self._grpc_address = grpc_address
        self._partitions = partitions
        self._ttl_s = ttl_s
        self._tick_s = tick_s
        self._connect_timeout_s = connect_timeout_s
        self._listener = listener
        self._started_at = time.time()
        self._conn: psycopg.AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._replicas: list[ReplicaInfo] = []
        self._leader_id: str | None = None
        self._desired_for: tuple[str, ...] = ()
        self._desired: set[int] = set()
        self._fresh_session = False
        self.ticks = 0
        """Ticks completed since start (for metrics, and for tests that count ticks, not seconds)."""
        self.is_leader = False
        """Whether this replica holds the leader lock (as of the last tick)."""
        self.leader_epoch: int | None = None
        """The epoch this replica's leader writes carry; None unless it leads."""
        self.owned: dict[int, int] = {}
        """Partitions this replica holds -> their epochs (for fenced liveness writes)."""

    @property
    def connected(self) -> bool:
        """Whether the control session is open (False while reconnecting: nothing is held then)."""
        return self._conn is not None

    def replicas(self) -> list[ReplicaInfo]:
        """Live replicas as of the last tick, by id (empty before the first)."""
        return list(self._replicas)

    def leader_id(self) -> str | None:
        """The leading replica as of the last tick; None while nobody (known to be live) leads."""
        return self._leader_id

    async def start(self) -> None:
        """Connect and run the first tick, so leadership and partitions are settled when this
        returns; then tick in the background. Raises :class:`ControlUnavailable` if that fails."""
        self._stopping.clear()
        try:
            await self._connect()
            await self._tick()
        except _SESSION_ERRORS as exc:
            await self._drop_session()
            raise ControlUnavailable(
                f"replica {self.replica_id!r}: control session on {masked_url(self._url)} failed: {exc}"
            ) from exc
        except BaseException:
            await self._drop_session()
            raise
        self._task = asyncio.create_task(self._run(), name=f"ha-control-{self.replica_id}")

    async def stop(self) -> None:
        """Give up leadership and partitions (listener first), delete this replica's row and close."""
        self._stopping.set()
        if self._task is not None:
            # Let a tick under way finish rather than cancel it mid-statement; give up after a TTL.
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=self._ttl_s + self._tick_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        conn = self._conn
        self._lose_roles()
        if conn is not None:
            try:
                await session.leave(conn, self.replica_id)
            except psycopg.Error as exc:  # closing the session below releases the locks anyway
                log.warning("replica %s: leaving cleanly failed: %s", self.replica_id, exc)
        await self._drop_session()

    async def _run(self) -> None:
        """Tick every ``tick_s``; on a lost session drop every role and reconnect with backoff."""
        failures = 0
        while not self._stopping.is_set():
            delay = min(max(_BACKOFF_MAX_S, self._tick_s), self._tick_s * 2 ** max(0, failures - 1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                return
            try:
                if self._conn is None:
                    await self._connect()
                    log.info("replica %s: control session reconnected", self.replica_id)
                await self._tick()
                failures = 0
            except _SESSION_ERRORS as exc:
                failures += 1
                if failures == 1:
                    log.warning("replica %s: control session lost, roles dropped: %s", self.replica_id, exc)
                await self._drop_session()
            except Exception:
                # A bug must not leave this replica holding roles it no longer tracks: drop them
                # all, as for a lost session, and start over.
                failures += 1
                log.exception("replica %s: control tick failed, roles dropped", self.replica_id)
                await self._drop_session()

    async def _connect(self) -> None:
        self._conn = await session.connect(
            self._url, self.replica_id, ttl_s=self._ttl_s, connect_timeout_s=self._connect_timeout_s
        )
        self._fresh_session = True

    async def _tick(self) -> None:
        """One round: reap stale peers, renew presence, read the live set, then try to lead and
        move partitions toward their rendezvous owners. A tick slower than a TTL counts as a lost
        session: peers already think this replica gone and are ending its session."""
        conn = self._conn
        assert conn is not None
        async with asyncio.timeout(self._ttl_s):
            reaped = await session.reap(conn, ttl_s=self._ttl_s, forget_s=_FORGET_TTLS * self._ttl_s)
            if reaped:
                log.warning("replica %s: ended the sessions of unresponsive replicas %s", self.replica_id, reaped)
            info = {"leader": self.is_leader, "partitions": sorted(self.owned)}
            await session.renew_presence(
                conn,
                self.replica_id,
                http_url=self._http_url,
                grpc_address=self._grpc_address,
                started_at=self._started_at,
                info=info,
            )
            rows = await session.live_replicas(conn, ttl_s=self._ttl_s)
            if not self.is_leader and self._may_run_for_leader(rows):
                epoch = await session.try_leadership(conn, self.replica_id)
                if epoch is not None:
                    self.is_leader, self.leader_epoch = True, epoch
                    self._notify(self._listener.leadership_gained, epoch)
            await self._rebalance(conn, [row.replica_id for row in rows])
        self._fresh_session = False
        self.ticks += 1
        self._remember(rows)

    def _may_run_for_leader(self, rows: list[session.ReplicaRow]) -> bool:
        """Whether to try the leader lock this tick. Not on the first tick of a new session while
        other replicas are live: one of them leads or takes over on its next tick, so a replica
        that just lost its session (or just started) does not snatch leadership back and make it
        flap. Alone, it leads at once."""
        return not self._fresh_session or all(row.replica_id == self.replica_id for row in rows)

    async def _rebalance(self, conn: psycopg.AsyncConnection, live_ids: Sequence[str]) -> None:
        """Release the partitions another live replica now wins (listener first, then unlock),
        and try the locks of those this replica wins but does not hold yet."""
        desired = self._desired_partitions(live_ids)
        lost = {k for k in self.owned if k not in desired}
        if lost:
            for k in lost:
                del self.owned[k]
            self._notify(self._listener.partitions_released, lost)
            await session.release_partitions(conn, sorted(lost))
        wanted = sorted(desired - self.owned.keys())
        gained = await session.try_partitions(conn, self.replica_id, wanted)
        if gained:
            self.owned.update(gained)
            self._notify(self._listener.partitions_gained, gained)

    def _desired_partitions(self, live_ids: Sequence[str]) -> set[int]:
        """This replica's rendezvous share for ``live_ids``, recomputed only when the set changes."""
        key = tuple(sorted({*live_ids, self.replica_id}))
        if key != self._desired_for:
            self._desired_for = key
            self._desired = partitions_of(self.replica_id, key, self._partitions)
        return self._desired

    def _remember(self, rows: list[session.ReplicaRow]) -> None:
        """Keep the live set and the leader for :meth:`replicas` and :meth:`leader_id`."""
        ids = {row.replica_id for row in rows}
        recorded = rows[0].leader_id if rows else None
        if self.is_leader:
            self._leader_id = self.replica_id
        elif recorded in ids and recorded != self.replica_id:
            self._leader_id = recorded
        else:
            self._leader_id = None
        self._replicas = [self._info(row) for row in rows]

    def _info(self, row: session.ReplicaRow) -> ReplicaInfo:
        mine = row.replica_id == self.replica_id
        partitions = sorted(self.owned) if mine else [int(k) for k in row.info.get("partitions", [])]
        return ReplicaInfo(
            replica_id=row.replica_id,
            http_url=row.http_url,
            grpc_address=row.grpc_address,
            leader=row.replica_id == self._leader_id,
            partitions=partitions,
            started_at=row.started_at,
            seen_age_s=row.seen_age_s,
        )

    def _lose_roles(self) -> None:
        """Forget leadership and partitions, telling the listener (the locks are gone or going)."""
        if self.is_leader:
            self.is_leader, self.leader_epoch = False, None
            if self._leader_id == self.replica_id:
                self._leader_id = None
            self._notify(self._listener.leadership_lost)
        if self.owned:
            released = set(self.owned)
            self.owned = {}
            self._notify(self._listener.partitions_released, released)

    async def _drop_session(self) -> None:
        """Lose every role and close the connection; PostgreSQL frees any lock it still held."""
        self._lose_roles()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    def _notify(self, callback: Callable[..., None], *args: object) -> None:
        """Call a listener method; its failure is logged, never allowed to stop the ticks."""
        try:
            callback(*args)
        except Exception:
            log.exception("replica %s: control listener %s failed", self.replica_id, callback.__name__)
