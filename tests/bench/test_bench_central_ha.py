"""bench.central_ha at a tiny size: three replicas on a private PostgreSQL, S3 server and
Mosquitto lose their leader and then another replica, and the run reports every key (and, at
this size too, loses no push, answers every gateway request and declares no live node dead);
its decisions section kills a leader right after it decided one of each kind and loses none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.central_ha import TARGETS, main


@pytest.mark.timeout(240)
def test_central_ha_bench_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ha.json"
    argv = [
        "--nodes", "200", "--window-s", "6", "--rate", "2", "--partitions", "16",
        "--sim-procs", "1", "--connections", "2", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0, json.loads(out.read_text())["errors"]
    assert "leader_takeover_s" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in (
        "replicas", "nodes", "pushes_acked", "pushes_lost", "leader_takeover_s", "edge_reattach_s_p99",
        "gateway_requests", "gateway_errors", "false_deaths", "missed_deaths", "heartbeat_share_max_over_mean",
        "seal_cpu_s_per_change", "seal_cpu_s_per_change_old", "decisions_lost_on_leader_kill", "decisions",
        "s3_restart_pushes_lost", "s3_restart_half_listed", "s3_restart_ready_s", "s3_start_s",
        "cpu_flags", "machine", "targets", "met",
    ):  # fmt: skip
        assert key in data, key
    assert data["targets"] == TARGETS and data["replicas"] == 3 and data["nodes"] == 200
    assert data["pushes_acked"] > 0 and data["pushes_lost"] == 0, data["lost"]
    assert data["gateway_requests"] > 50 and data["gateway_errors"] == 0
    assert data["false_deaths"] == 0, data["false_dead_nodes"]
    assert data["missed_deaths"] == 0 and data["silenced"] == 2
    assert data["edges_moved"] >= 1 and data["edge_reattach_s_p99"] is not None
    assert data["leader_takeover_s"] < 5
    made = data["decisions"]["made"]
    assert made["fallbacks"] >= 1 and made["verdicts"] >= 1 and made["caps"] >= 1 and made["rollout_steps"] >= 1
    assert data["decisions_lost_on_leader_kill"] == 0, data["decisions"]
    # SeaweedFS SIGKILLed twice under pushes: every acked push still there, byte for byte
    assert data["s3_restarts"] == 2 and data["s3_restart_pushes_acked"] > 0
    assert data["s3_restart_pushes_lost"] == 0 and data["s3_restart_half_listed"] == 0, data["s3_restart_problems"]
    assert data["s3_restart_unclear_answers"] == 0, data["s3_restart_problems"]
