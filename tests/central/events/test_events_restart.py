"""Central's event log survives a SIGKILL: a real ``modelfleet central`` process pushes,
starts a rollout and is killed; a central started again on the same data directory
serves the same events (same numbers) over ``/api/v1/events`` and the dashboard, says how
it started (``central_started``) and which rollout it picked up (``rollout_resumed``),
and numbers its own events after every number the killed one may have handed out."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench._fleet import Fleet
from central.server import CentralServer
from support.fleet import central_settings

pytestmark = pytest.mark.fleet  # central as a process, SIGKILLed and started again

ENV = {
    "MODELFLEET_CHUNKING__AVG_BYTES": "65536",
    "MODELFLEET_CHUNKING__MIN_BYTES": "16384",
    "MODELFLEET_CHUNKING__MAX_BYTES": "262144",
    "MODELFLEET_QUANTIZE__ENABLED": "false",
    "MODELFLEET_MQTT__ENABLED": "false",
    "MODELFLEET_LOG_LEVEL": "warning",
}


def _types_on_disk(data_dir: Path) -> list[str]:
    with sqlite3.connect(data_dir / "central.sqlite3") as db:
        return [r[0] for r in db.execute("SELECT type FROM events ORDER BY seq")]


def _before_the_kill(data_dir: Path, url: str, model: Path) -> list[dict[str, Any]]:
    """Push v1 and v2 (stored only), start a rollout to v2; wait until its event is on disk."""
    with httpx.Client(base_url=url, timeout=30.0) as api:
        for version, activate in (("1", "true"), ("2", "false")):
            params = {"version": version, "activate": activate}
            pushed = api.post("/api/v1/models/tiny/versions", params=params, content=model.read_bytes())
            assert pushed.status_code == 201, pushed.text
        started = api.post("/api/v1/models/tiny/rollouts", json={"version": "2"})
        assert started.status_code == 201, started.text
        deadline = time.monotonic() + 10
        while "rollout_started" not in _types_on_disk(data_dir):
            assert time.monotonic() < deadline, "the rollout's event never reached central.sqlite3"
            time.sleep(0.02)
        events: list[dict[str, Any]] = api.get("/api/v1/events").json()
    return events


async def test_the_event_log_survives_a_sigkill_and_tells_what_the_restart_resumed(
    tmp_path: Path, small_model_file: Path
) -> None:
    with Fleet(root=tmp_path, central_env=ENV) as fleet:
        assert fleet.dir is not None
        data_dir = fleet.dir / "central"
        central = fleet.start_central()
        try:
            before = _before_the_kill(data_dir, central.http_url, small_model_file)
        finally:
            fleet.kill_central()
        assert [e["type"] for e in before] == ["central_started", "model_pushed", "model_pushed", "rollout_started"]
        assert before[0]["detail"] == {
            "fresh": True,
            "previous_stop": None,
            "events_restored": 0,
            "rollouts_resumed": 0,
        }
        assert [e["seq"] for e in before] == [1, 2, 3, 4]
        assert {e["actor"] for e in before[1:]} == {"anonymous"}  # auth is off

        server = CentralServer(central_settings(data_dir))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.http_url, timeout=30.0) as api:
                after = (await api.get("/api/v1/events")).json()
                assert after[: len(before)] == before  # the same events, the same numbers
                started, resumed = after[len(before) :]
                assert started["type"] == "central_started"
                assert started["detail"] == {
                    "fresh": False,
                    "previous_stop": "unclean",
                    "events_restored": 4,
                    "rollouts_resumed": 1,
                }
                assert started["seq"] > before[-1]["seq"]  # past any number the killed central handed out
                assert resumed["type"] == "rollout_resumed" and resumed["seq"] == started["seq"] + 1
                rollout_id = before[-1]["detail"]["rollout_id"]
                assert resumed["detail"] == {
                    "model": "tiny",
                    "version": "2",
                    "rollout_id": rollout_id,
                    "reason": "resumed in state canary",
                }

                page = (await api.get("/api/v1/events", params={"since": before[1]["seq"], "limit": 2})).json()
                assert [e["seq"] for e in page] == [before[2]["seq"], before[3]["seq"]]
                newer = (await api.get("/api/v1/events", params={"since": before[-1]["seq"]})).json()
                assert [e["type"] for e in newer] == ["central_started", "rollout_resumed"]

                dashboard = (await api.get("/api/v1/dashboard")).json()
                assert [e["type"] for e in dashboard["events"]][:2] == ["rollout_resumed", "central_started"]
                assert dashboard["events"][-1] == before[0]  # newest first, down to the killed central's first
        finally:
            await server.stop()
