"""Wakes a replica when the fleet generation grows, so it re-reads the shared state at once
instead of on a slow timer.

NOTIFY is only a wake-up: it is not stored, and one sent while the listening session is down
is gone. So the watcher re-reads ``ha_generation`` after every (re)connect and every
``poll_s`` anyway; a missed NOTIFY costs at most one poll, never a lost change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import psycopg

from central.ha.fleet_store import CHANNEL
from central.storage.postgres.pool import StoreUnavailable, masked_url

_log = logging.getLogger(__name__)

__all__ = ["GenerationWatcher"]

#: First wait after a failed reconnect; doubles up to the cap, so a PostgreSQL that is down
#: for minutes is tried every few seconds rather than hammered.
#: The longest ``stop`` waits for the listening task once cancelled.
_STOP_TIMEOUT_S = 5.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
#: What the watcher's session is called in pg_stat_activity.
APPLICATION_NAME = "modelfleet-generation-watcher"

_LOST = (psycopg.Error, OSError, TimeoutError)


class GenerationWatcher:
    """Calls ``on_change(gen)`` on the event loop whenever the fleet generation grows.

    Bursts coalesce: NOTIFYs that arrive before the loop gets round to the callback yield one
    call with the latest generation, so a replica re-reads once per burst, not once per write.
    Generations never go backwards in the calls, and the same one is never reported twice."""

    def __init__(
        self,
        url: str,
        on_change: Callable[[int], None],
        *,
        poll_s: float = 1.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self._url = url
        self._on_change = on_change
        self._poll_s = poll_s
        self._connect_timeout_s = connect_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._pending = -1
        self._scheduled = False
        self._running = False
        self.last_gen = -1
        """The last generation reported to ``on_change`` (-1 before ``start``)."""
        self.connected = False
        """Whether the LISTEN session is up now."""
        self.reconnects = 0
        """How many times the session was re-established after it was lost."""
        self.backend_pid: int | None = None
        """The PostgreSQL pid of the LISTEN session (for pg_stat_activity), None while down."""

    async def start(self) -> None:
        """Connect, LISTEN, report the current generation once; fails (``StoreUnavailable``)
        when PostgreSQL cannot be reached, like the stores do at start-up."""
        try:
            conn = await self._connect()
        except _LOST as exc:
            raise StoreUnavailable(
                f"generation watcher: cannot listen on PostgreSQL at {masked_url(self._url)}: {exc}"
            ) from exc
        self._running = True
        self._deliver()
        self._task = asyncio.create_task(self._run(conn), name="generation-watcher")

    async def stop(self) -> None:
        """Stop listening and close the session."""
        self._running = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Bounded: a session stuck in the driver must not hold the replica's stop for ever.
            done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
            if not done:
                _log.warning("generation watcher: the listening session did not stop in %.0f s", _STOP_TIMEOUT_S)
        self.connected = False
        self.backend_pid = None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        """A new session that LISTENs, then reads the generation: LISTEN first, so a change
        committed between the two is either in the read or NOTIFYed, never neither."""
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self._connect_timeout_s)),
                application_name=APPLICATION_NAME,
            ),
            self._connect_timeout_s,
        )
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            await self._read_gen(conn)
        except BaseException:
            await conn.close()
            raise
        self.connected = True
        self.backend_pid = conn.info.backend_pid
        return conn

    async def _run(self, conn: psycopg.AsyncConnection[Any] | None) -> None:
        """Listen until cancelled; on a lost session, reconnect at once, then back off."""
        backoff = _BACKOFF_FIRST_S
        while True:
            if conn is None:
                try:
                    conn = await self._connect()
                except _LOST as exc:
                    _log.warning("generation watcher: reconnect failed (%s); next try in %.1f s", exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
                    continue
                self.reconnects += 1
                backoff = _BACKOFF_FIRST_S
                _log.info("generation watcher: reconnected to %s", masked_url(self._url))
            try:
                await self._listen(conn)
            except _LOST as exc:
                _log.warning("generation watcher: lost PostgreSQL session (%s); reconnecting", exc)
            finally:
                self.connected = False
                self.backend_pid = None
                with contextlib.suppress(*_LOST):
                    await conn.close()
            conn = None

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take NOTIFYs for ``poll_s``, then re-read the generation; forever, or until the
        session fails. The re-read also finds a dead TCP peer that would never say so."""
        while True:
            # aclosing: the generator holds the connection's lock until closed, and the
            # re-read below needs it.
            async with contextlib.aclosing(conn.notifies(timeout=self._poll_s)) as notifies:
                async for notify in notifies:
                    if not (notify.payload.isascii() and notify.payload.isdigit()):
                        break  # not ours (someone else NOTIFYed the channel): re-read now
                    self._offer(int(notify.payload))
            await self._read_gen(conn)

    async def _read_gen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await asyncio.wait_for(
            conn.execute("SELECT gen FROM ha_generation WHERE id = 1"), self._connect_timeout_s
        )
        row = await cur.fetchone()
        if row is not None:
            self._offer(int(row[0]))

    def _offer(self, gen: int) -> None:
        """Note ``gen`` and make sure one callback is queued; later offers before it runs
        only raise the generation it will report."""
        if gen <= self._pending:
            return
        self._pending = gen
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        if not self._running or self._pending <= self.last_gen:
            return
        self.last_gen = self._pending
        try:
            self._on_change(self.last_gen)
        except Exception:
            _log.exception("generation watcher: on_change(%d) failed", self.last_gen)
