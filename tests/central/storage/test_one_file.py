"""Central keeps its registry, rollouts and event log in one SQLite file (``central.sqlite3``):
a data dir of an older central (three files) is imported once and keeps its models, rollouts
and events; and a plain push's version and its activation commit together or not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from support.fleet import central_settings, push

#: The three files an older central kept, with their schemas as that central made them.
LEGACY = {
    "registry.sqlite3": {
        "models": "CREATE TABLE models (name TEXT PRIMARY KEY, created_at TEXT NOT NULL)",
        "versions": "CREATE TABLE versions (name TEXT NOT NULL REFERENCES models(name), version TEXT NOT NULL,"
        " seq INTEGER NOT NULL, manifest TEXT NOT NULL, artifacts TEXT NOT NULL DEFAULT '{}',"
        " created_at TEXT NOT NULL, PRIMARY KEY (name, version))",
    },
    "rollouts.sqlite3": {
        "releases": "CREATE TABLE releases (model TEXT PRIMARY KEY, stable TEXT, epoch INTEGER NOT NULL DEFAULT 0)",
        "rollouts": "CREATE TABLE rollouts (id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL,"
        " state TEXT NOT NULL, body TEXT NOT NULL)",
    },
    "events.sqlite3": {
        "events": "CREATE TABLE events (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL, type TEXT NOT NULL,"
        " node_id TEXT, body TEXT NOT NULL)",
        "meta": "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    },
}
#: Where each old table's rows are in ``central.sqlite3``.
NEW_NAME = {"meta": "events_meta"}


async def _observe(data_dir: Path, act: bool, model: Path | None = None, url: str | None = None) -> dict[str, Any]:
    """Start central on ``data_dir`` (and PostgreSQL ``url``; with ``act``: push two versions and
    start a rollout first); what its API says about models, versions, rollouts and events."""
    server = CentralServer(central_settings(data_dir, store={"url": url}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:
            if act and model is not None:
                assert (await push(api, "tiny", model, version="1")).status_code == 201
                assert (await push(api, "tiny", model, version="2", activate="false")).status_code == 201
                started = await api.post("/api/v1/models/tiny/rollouts", json={"version": "2"})
                assert started.status_code == 201, started.text
            versions = (await api.get("/api/v1/models/tiny/versions")).json()
            return {
                "models": [(m["name"], m["versions"], m["latest"]) for m in (await api.get("/api/v1/models")).json()],
                "versions": [(v["version"], v["sha256"]) for v in versions],
                "rollouts": [(r["id"], r["version"], r["state"]) for r in (await api.get("/api/v1/rollouts")).json()],
                "events": [(e["seq"], e["type"]) for e in (await api.get("/api/v1/events?limit=1000")).json()],
            }
    finally:
        await server.stop()


def _split_into_legacy_files(data_dir: Path) -> None:
    """Turn ``central.sqlite3`` into the three files an older central would have left."""
    with sqlite3.connect(data_dir / "central.sqlite3") as new:
        for file, tables in LEGACY.items():
            with sqlite3.connect(data_dir / file) as old:
                for table, ddl in tables.items():
                    old.execute(ddl)
                    rows = new.execute(f"SELECT * FROM {NEW_NAME.get(table, table)}").fetchall()
                    if rows:
                        marks = ", ".join("?" * len(rows[0]))
                        old.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    new.close()
    for leftover in data_dir.glob("central.sqlite3*"):
        leftover.unlink()


async def test_an_older_data_dir_keeps_its_models_rollouts_and_events(tmp_path: Path, small_model_file: Path) -> None:
    data_dir = tmp_path / "central"
    before = await _observe(data_dir, act=True, model=small_model_file)
    assert before["versions"] and before["rollouts"] and before["events"]
    _split_into_legacy_files(data_dir)

    after = await _observe(data_dir, act=False)
    assert {k: after[k] for k in ("models", "versions", "rollouts")} == {
        k: before[k] for k in ("models", "versions", "rollouts")
    }
    assert after["events"][: len(before["events"])] == before["events"]  # then this start's own
    files = sorted(p.name for p in data_dir.iterdir() if "sqlite3" in p.name)
    assert "central.sqlite3" in files
    assert {f"{name}.imported" for name in LEGACY} <= set(files)
    assert not set(LEGACY) & set(files), "the old files are renamed, so the import runs once"

    again = await _observe(data_dir, act=False)
    assert again["versions"] == before["versions"] and again["rollouts"] == before["rollouts"]
    assert again["events"][: len(after["events"])] == after["events"]  # nothing imported twice


def _refuse_release_writes(data_dir: Path, url: str | None) -> None:
    """From now on every write of a release pointer fails (a trigger), as a disk error would."""
    if url is None:
        with sqlite3.connect(data_dir / "central.sqlite3") as db:
            for op in ("INSERT", "UPDATE"):
                db.execute(
                    f"CREATE TRIGGER refuse_{op.lower()} BEFORE {op} ON releases"
                    " BEGIN SELECT RAISE(ABORT, 'release pointers cannot be written'); END"
                )
        db.close()
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'release pointers cannot be written'; END $$"
        )
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON releases FOR EACH ROW EXECUTE FUNCTION refuse()")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.fleet)])
async def test_a_push_and_its_activation_commit_together(
    tmp_path: Path, small_model_file: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """When the activation's write fails, the pushed version is not stored either: no version
    that the fleet was never told to serve, and a retry with the same label is not a 409."""
    url = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    data_dir = tmp_path / "central"
    before = await _observe(data_dir, act=True, model=small_model_file, url=url)
    _refuse_release_writes(data_dir, url)

    server = CentralServer(central_settings(data_dir, store={"url": url}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:
            await api.post("/api/v1/models/tiny/rollback")  # the rollout in progress would refuse a plain push
            refused = await push(api, "tiny", small_model_file, version="3")
            assert refused.status_code == 500
            listed = [v["version"] for v in (await api.get("/api/v1/models/tiny/versions")).json()]
            assert listed == [v for v, _ in before["versions"]], "the version went with its activation"
            # Storing without activating writes no release pointer here (the model has one): it goes in.
            stored = await push(api, "tiny", small_model_file, version="3", activate="false")
            assert stored.status_code == 201, stored.text
    finally:
        await server.stop()
