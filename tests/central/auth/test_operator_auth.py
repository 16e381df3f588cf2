"""Operator API authentication against a real central with ``auth.enabled``: writes need
an admin token, a viewer may read but not write, reads open unless ``protect_reads``,
a revoked token stops working without a restart, the store holds no plaintext, and the
CLI carries ``--token`` end to end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from modelfleet.cli import app
from support.fleet import central_settings, push


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """Central with auth on (reads open), its token store in its data directory."""
    server = CentralServer(central_settings(tmp_path / "central", auth={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def cli(tmp_path: Path, central_url: str, *args: str) -> Result:
    """``modelfleet ARGS`` in a worker thread (central keeps serving on the loop), no config file."""
    config = tmp_path / "cli-config.toml"
    config.write_text("", encoding="utf-8")
    env = {"MODELFLEET_CONFIG": str(config), "MODELFLEET_CENTRAL_URL": central_url, "MODELFLEET_TOKEN": ""}
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_writes_need_an_admin_token_and_reads_stay_open(
    tmp_path: Path, secured: CentralServer, small_model_file: Path
) -> None:
    data_dir = tmp_path / "central"
    created = await cli(
        tmp_path, secured.http_url, "token", "create", "--name", "ci", "--role", "admin", "--data-dir", str(data_dir)
    )
    assert created.exit_code == 0, created.stderr
    admin = created.stdout.strip()
    viewer = TokenStore(data_dir / "tokens.json").create("dash", Role.VIEWER)
    stored = (data_dir / "tokens.json").read_text()
    assert admin not in stored and viewer not in stored and "ci" in stored

    async with httpx.AsyncClient(base_url=secured.http_url, timeout=30.0) as api:
        anonymous = await push(api, "tiny", small_model_file)
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": "missing or invalid token"}
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert (await api.get("/api/v1/models")).json() == []  # nothing stored; reads open by default

        api.headers.update(bearer(viewer))
        refused = await push(api, "tiny", small_model_file)
        assert refused.status_code == 403 and refused.json()["error"].startswith("role viewer may not POST")
        rollout = await api.post("/api/v1/models/tiny/rollouts", json={"version": "1"})
        assert rollout.status_code == 403

        api.headers.update(bearer(admin))
        assert (await push(api, "tiny", small_model_file)).status_code == 201
        assert (await push(api, "tiny", small_model_file, version="2")).status_code == 201  # v1 retires
        api.headers.update(bearer(viewer))
        assert (await api.delete("/api/v1/models/tiny/versions/1")).status_code == 403
        api.headers.update(bearer(admin))
        assert (await api.delete("/api/v1/models/tiny/versions/1")).status_code == 204

        listed = await cli(tmp_path, secured.http_url, "token", "list", "--json", "--data-dir", str(data_dir))
        assert {t["name"]: t["role"] for t in json.loads(listed.stdout)} == {"ci": "admin", "dash": "viewer"}
        assert admin not in listed.stdout
        revoked = await cli(tmp_path, secured.http_url, "token", "revoke", "--name", "ci", "--data-dir", str(data_dir))
        assert revoked.exit_code == 0, revoked.stderr
        assert (await push(api, "tiny", small_model_file, version="3")).status_code == 401  # no restart needed
        api.headers.update(bearer("mft_not-a-token"))
        assert (await push(api, "tiny", small_model_file, version="3")).status_code == 401
        assert (await api.get("/healthz")).status_code == 200


async def test_protect_reads_puts_reads_behind_a_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "central"
    viewer = TokenStore(data_dir / "tokens.json").create("dash", Role.VIEWER)
    server = CentralServer(central_settings(data_dir, auth={"enabled": True, "protect_reads": True}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:
            for path in ("/api/v1/models", "/metrics", "/dashboard"):
                assert (await api.get(path)).status_code == 401, path
                assert (await api.get(path, headers=bearer(viewer))).status_code == 200, path
            assert (await api.get("/healthz")).status_code == 200
    finally:
        await server.stop()


async def test_a_browser_signs_in_to_a_protect_reads_dashboard_with_a_cookie_that_only_reads(
    tmp_path: Path, small_model_file: Path
) -> None:
    """A page load and an EventSource cannot send ``Authorization``: the form turns the token
    into an HttpOnly, SameSite=Strict cookie, good for reads (page, snapshot, stream with the
    rollouts) and never for writes; a revoked token's cookie stops working."""
    data_dir = tmp_path / "central"
    store = TokenStore(data_dir / "tokens.json")
    viewer, admin = store.create("dash", Role.VIEWER), store.create("ops", Role.ADMIN)
    server = CentralServer(central_settings(data_dir, auth={"enabled": True, "protect_reads": True}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as browser:
            page = await browser.get("/dashboard")
            assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
            assert 'action="/dashboard/login"' in page.text and 'name="token"' in page.text
            wrong = await browser.post("/dashboard/login", data={"token": "mft_not-a-token"})
            assert wrong.status_code == 401 and "unknown or revoked token" in wrong.text
            assert "set-cookie" not in wrong.headers and not browser.cookies

            signed_in = await browser.post("/dashboard/login", data={"token": viewer})
            assert signed_in.status_code == 303 and signed_in.headers["location"] == "/dashboard"
            cookie = signed_in.headers["set-cookie"].lower()
            assert "modelfleet_token=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
            assert "secure" not in cookie  # plain HTTP here; set with HTTPS (tests/modelfleet/test_up.py)
            for path in ("/dashboard", "/dashboard/app.js", "/api/v1/dashboard", "/api/v1/nodes", "/metrics"):
                assert (await browser.get(path)).status_code == 200, path

            # The dashboard's own read of the rollouts carries the page's cookie too.
            headers = bearer(admin)
            assert (await push(browser, "tiny", small_model_file, activate="false", version="1")).status_code == 401
            pushed = await browser.post(
                "/api/v1/models/tiny/versions", params={"activate": "false"}, content=small_model_file.read_bytes(),
                headers=headers,
            )  # fmt: skip
            assert pushed.status_code == 201, pushed.text
            started = await browser.post("/api/v1/models/tiny/rollouts", json={"version": "1"}, headers=headers)
            assert started.status_code == 201, started.text
            assert [r["version"] for r in (await browser.get("/api/v1/dashboard")).json()["rollouts"]] == ["1"]
            async with browser.stream("GET", "/api/v1/stream") as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        assert json.loads(line[5:])["rollouts"][0]["version"] == "1"
                        break

            # The cookie never writes, even an admin's: a page elsewhere cannot act through it.
            browser.cookies.clear()
            assert (await browser.post("/dashboard/login", data={"token": admin})).status_code == 303
            assert (await browser.delete("/api/v1/models/tiny/versions/1")).status_code == 401

            store.revoke("ops")
            assert (await browser.get("/api/v1/nodes")).status_code == 401
            out = await browser.post("/dashboard/logout")
            assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
            assert (await browser.get("/dashboard")).status_code == 401
    finally:
        await server.stop()


async def test_cli_push_carries_its_token(tmp_path: Path, secured: CentralServer, small_model_file: Path) -> None:
    admin = TokenStore(tmp_path / "central" / "tokens.json").create("ci", Role.ADMIN)

    without = await cli(tmp_path, secured.http_url, "push", str(small_model_file), "--name", "tiny")
    assert without.exit_code == 1
    lines = without.stderr.strip().splitlines()
    assert lines == ["error: missing or invalid token (HTTP 401)"], without.stderr

    pushed = await cli(tmp_path, secured.http_url, "push", str(small_model_file), "--name", "tiny", "--token", admin)
    assert pushed.exit_code == 0, pushed.stderr
    assert "tiny:1" in pushed.stdout
