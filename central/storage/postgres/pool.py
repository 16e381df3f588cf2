"""One way to open a PostgreSQL connection pool for central's stores: open it, wait for the
server, apply the bundled migrations, and fail with the URL (password masked) when the
server cannot be reached. The registry, rollout, event and token stores all open theirs
here, so every store is migrated the same way whichever of them opens first."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from central.storage.offload import request_wait
from central.storage.postgres.migrate import apply_migrations


class StoreUnavailable(RuntimeError):
    """The database could not be reached at start-up; the message names it (password masked)."""


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: the only form that may be logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


#: The longest a request's thread (the event loop's, or a ``StoreCalls`` worker's) waits for a
#: pooled connection. While PostgreSQL is away a request would otherwise wait the full pool
#: timeout (seconds): on the loop that froze every request of the process, ``/readyz``
#: included; in a worker it would hold the worker and answer the client late.
ON_LOOP_WAIT_S = 0.25
#: What a request's thread waits once the pool's last connection attempt failed: only for a
#: connection that is ready now (a zero timeout would refuse even that).
_REFUSED_WAIT_S = 0.01
_RECONNECT_SERIES_S = 2.0


class LoopSafePool(ConnectionPool[Any]):
    """A pool whose waits are short on a request's thread (``offload.request_wait``): there it
    gives up after :data:`ON_LOOP_WAIT_S`, or at once when its last attempt to connect failed
    (PostgreSQL is down or restarting), so an outage costs a request milliseconds and a 503,
    not the pool timeout. Other threads (the push pipeline's commit) wait the full timeout as
    before, so work that can afford to wait still rides out a restart."""

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        self.last_connect_failed = False
        pool = self

        class _Connection(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, *args: Any, **kw: Any) -> Any:
                try:
                    conn = super().connect(*args, **kw)
                except psycopg.OperationalError:
                    pool.last_connect_failed = True
                    raise
                pool.last_connect_failed = False
                return conn

        super().__init__(conninfo, connection_class=_Connection, **kwargs)

    def reachable(self) -> bool:
        """Whether a connection can be had now. While the last attempt failed, asking queues
        a request for a connection, which makes the pool try again at once: probes (``/readyz``)
        drive the reconnect instead of the pool's own backoff, which doubles without bound."""
        if not self.last_connect_failed:
            return True
        try:
            with self.connection(timeout=_REFUSED_WAIT_S):
                return True
        except PoolTimeout:
            return False

    def getconn(self, timeout: float | None = None) -> Any:
        """A connection; on a request's thread, within a short wait (see the class)."""
        if not request_wait():
            return super().getconn(timeout)
        wait = _REFUSED_WAIT_S if self.last_connect_failed else ON_LOOP_WAIT_S
        try:
            return super().getconn(min(self.timeout if timeout is None else timeout, wait))
        except PoolTimeout:
            why = "its last connection attempt failed" if self.last_connect_failed else "no connection was free"
            raise PoolTimeout(f"PostgreSQL pool {self.name!r}: {why}") from None


def open_pool(
    url: str, *, name: str, pool_size: int = 4, connect_timeout_s: float = 10.0
) -> tuple[LoopSafePool, list[str]]:
    """An open pool on ``url`` with the migrations applied; returns it and the versions this call applied."""
    # ``check``: a connection that PostgreSQL closed meanwhile (a restart, a failover) is
    # replaced before it is handed out, so the first request after a restart does not fail.
    pool = LoopSafePool(
        url,
        min_size=1,
        max_size=pool_size,
        timeout=connect_timeout_s,
        open=False,
        name=name,
        check=ConnectionPool.check_connection,
        # Each failed attempt series holds a slot while it backs off (1 s, 2 s, 4 s ... without
        # bound): end a series after 2 s, so requests and ``/readyz`` start fresh attempts and a
        # restarted server is found within a second, not after a minute of backoff.
        reconnect_timeout=_RECONNECT_SERIES_S,
    )
    try:
        pool.open(wait=True, timeout=connect_timeout_s)
        with pool.connection(timeout=connect_timeout_s) as conn:
            applied = apply_migrations(conn)
    except PoolTimeout as exc:
        pool.close()
        raise StoreUnavailable(
            f"PostgreSQL at {masked_url(url)} not reachable within {connect_timeout_s} s"
            " (is it running, and are the user and password right?)"
        ) from exc
    except BaseException:
        pool.close()
        raise
    return pool, applied
