"""A dashboard event stream does not outlive its token: with ``auth.protect_reads``, a stream
opened with a token (header or the browser's cookie) ends within seconds of the token's
revocation, with a last ``revoked`` message saying why, while a stream of a token still
valid goes on. On the token file (``modelfleet token revoke`` writes it) and on PostgreSQL,
where the revocation is made through another connection, as another replica or the CLI
would. A real central on loopback; the stream is read as a browser's EventSource would."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.auth import Role
from central.rest.browser_login import COOKIE
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from central.storage.protocols import Tokens
from support.fleet import central_settings
from support.sse import sse_events

#: The stream must end within this many seconds of the revocation (ticks are 1 s).
CLOSE_WITHIN_S = 3.0


def _store(kind: str, request: pytest.FixtureRequest, data_dir: Path) -> tuple[Tokens, dict[str, Any]]:
    """The token store the test revokes in, and the central settings that read it."""
    if kind == "file":
        return TokenStore(data_dir / "tokens.json"), {}
    from central.storage.postgres.tokens import PostgresTokenStore

    url = request.getfixturevalue("postgres_url")
    return PostgresTokenStore(url, "operator"), {"store": {"url": url}}


@pytest.mark.parametrize("kind", ["file", pytest.param("postgres", marks=pytest.mark.fleet)])
async def test_an_open_stream_ends_within_seconds_of_its_tokens_revocation(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    data_dir = tmp_path / "central"
    tokens, extra = _store(kind, request, data_dir)
    doomed, in_cookie, kept = (tokens.create(name, Role.VIEWER) for name in ("doomed", "cookie", "kept"))
    server = CentralServer(central_settings(data_dir, auth={"enabled": True, "protect_reads": True}, **extra))
    await server.start()
    try:
        async with (
            httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api,
            httpx.AsyncClient(base_url=server.http_url, timeout=30.0, cookies={COOKIE: in_cookie}) as browser,
            api.stream("GET", "/api/v1/stream", headers={"Authorization": f"Bearer {doomed}"}) as header_stream,
            browser.stream("GET", "/api/v1/stream") as cookie_stream,
            api.stream("GET", "/api/v1/stream", headers={"Authorization": f"Bearer {kept}"}) as kept_stream,
        ):
            streams = {"doomed": header_stream, "cookie": cookie_stream, "kept": kept_stream}
            events = {name: sse_events(response) for name, response in streams.items()}
            for name, response in streams.items():
                assert response.status_code == 200, name
                assert (await anext(events[name]))[0] == "snapshot", name

            async def until_the_end(name: str) -> tuple[list[tuple[str, Any]], float]:
                seen = [message async for message in events[name]]  # ends when the server ends it
                return seen, time.monotonic() - revoked_at

            tokens.revoke("doomed")
            tokens.revoke("cookie")
            revoked_at = time.monotonic()
            async with asyncio.timeout(10 * CLOSE_WITHIN_S):  # a bound for the test, not the claim
                ended = await asyncio.gather(until_the_end("doomed"), until_the_end("cookie"))
            for name, (seen, took) in zip(("doomed", "cookie"), ended, strict=True):
                assert took < CLOSE_WITHIN_S, f"{name}'s stream lasted {took:.1f}s after the revocation"
                last, why = seen[-1]
                assert last == "revoked" and f"token {name!r}" in why["reason"], seen
                assert all(event != "revoked" for event, _ in seen[:-1])

            snapshots = 0  # the stream of a token still valid goes on
            async with asyncio.timeout(10):
                async for event, _ in events["kept"]:
                    snapshots += event == "snapshot"
                    if snapshots == 2:
                        break
            assert snapshots == 2

        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:
            again = await api.get("/api/v1/stream", headers={"Authorization": f"Bearer {doomed}"})
            assert again.status_code == 401  # reconnecting does not help
        assert server.central.dashboard.closed_revoked == 2
        assert server.central.dashboard.closed_unchecked == 0
    finally:
        await server.stop()
        tokens.close()
