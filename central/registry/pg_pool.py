"""One way to open a PostgreSQL connection pool for central's stores: open it, wait for the
server, apply the bundled migrations, and fail with the URL (password masked) when the
server cannot be reached. The registry, rollout, event and token stores all open theirs
here, so every store is migrated the same way whichever of them opens first."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from psycopg_pool import ConnectionPool, PoolTimeout

from central.registry.pg_migrations import apply_migrations


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


def open_pool(
    url: str, *, name: str, pool_size: int = 4, connect_timeout_s: float = 10.0
) -> tuple[ConnectionPool, list[str]]:
    """An open pool on ``url`` with the migrations applied; returns it and the versions this call applied."""
    # ``check``: a connection that PostgreSQL closed meanwhile (a restart, a failover) is
    # replaced before it is handed out, so the first request after a restart does not fail.
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=pool_size,
        timeout=connect_timeout_s,
        open=False,
        name=name,
        check=ConnectionPool.check_connection,
    )
    try:
        pool.open(wait=True, timeout=connect_timeout_s)
        with pool.connection() as conn:
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
