"""A central on ``store.url`` keeps its rollouts, its event log and its API tokens in
PostgreSQL, not in its data directory: a central started again on another, empty data
directory with the same database serves the same rollout, the same events (same numbers)
and accepts the same token, created with ``modelfleet token create`` on ``MODELFLEET_STORE__URL``."""

from __future__ import annotations

from pathlib import Path

import httpx
from typer.testing import CliRunner

from central.auth import Role
from central.server import CentralServer
from central.storage.postgres.tokens import PostgresTokenStore
from modelfleet.cli import app
from support.fleet import central_settings, push


async def test_rollouts_events_and_tokens_survive_a_restart_on_postgres(
    postgres_url: str, tmp_path: Path, small_model_file: Path
) -> None:
    first_dir = tmp_path / "first"
    env = {"MODELFLEET_STORE__URL": postgres_url, "MODELFLEET_CONFIG": str(tmp_path / "none.toml")}
    made = CliRunner().invoke(
        app, ["token", "create", "--name", "ci", "--role", "admin", "--data-dir", str(first_dir)], env=env
    )
    assert made.exit_code == 0, made.output
    admin = made.stdout.strip()
    tokens = PostgresTokenStore(postgres_url, "operator")
    assert [(r.name, r.role) for r in tokens.records()] == [("ci", Role.ADMIN)], "the CLI wrote to PostgreSQL"
    tokens.close()
    auth = {"Authorization": f"Bearer {admin}"}

    first = CentralServer(central_settings(first_dir, store={"url": postgres_url}, auth={"enabled": True}))
    await first.start()
    try:
        async with httpx.AsyncClient(base_url=first.http_url, timeout=30.0, headers=auth) as api:
            for version, activate in (("1", "true"), ("2", "false")):
                r = await push(api, "tiny", small_model_file, version=version, activate=activate)
                assert r.status_code == 201, r.text
            started = await api.post("/api/v1/models/tiny/rollouts", json={"version": "2"})
            assert started.status_code == 201, started.text
            rollout = started.json()
            before = (await api.get("/api/v1/events")).json()
    finally:
        await first.stop()
    assert [e["type"] for e in before][-1] == "rollout_started"
    left = {p.name for p in first_dir.iterdir()}
    assert not left & {"central.sqlite3", "rollouts.sqlite3", "events.sqlite3", "tokens.json", "registry.sqlite3"}, left

    second = CentralServer(central_settings(tmp_path / "second", store={"url": postgres_url}, auth={"enabled": True}))
    await second.start()
    try:
        async with httpx.AsyncClient(base_url=second.http_url, timeout=30.0) as api:
            rollouts = (await api.get("/api/v1/rollouts")).json()
            assert [(r["id"], r["model"], r["state"]) for r in rollouts] == [(rollout["id"], "tiny", rollout["state"])]
            after = (await api.get("/api/v1/events")).json()
            kept = [(e["seq"], e["type"]) for e in after[: len(before)]]
            assert kept == [(e["seq"], e["type"]) for e in before], "the same events, the same numbers"
            assert after[len(before)]["type"] == "central_started"
            assert after[len(before)]["seq"] == before[-1]["seq"] + 1, "a clean stop leaves no gap"

            refused = await api.post("/api/v1/models/tiny/rollback")
            assert refused.status_code == 401, refused.text
            rolled_back = await api.post("/api/v1/models/tiny/rollback", headers=auth)
            assert rolled_back.status_code == 200, rolled_back.text
    finally:
        await second.stop()
