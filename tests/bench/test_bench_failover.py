"""The failover bench runs end to end at a tiny size and writes sane figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.failover import TARGETS, main


@pytest.mark.timeout(180)
def test_failover_bench_writes_sane_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "failover.json"
    argv = [
        "--json", str(out), "--interval", "0.5", "--duration-s", "1", "--concurrency", "2",
        "--timeout-s", "60", "--work-dir", str(tmp_path / "fleets"),
    ]  # fmt: skip
    rc = main(argv)
    printed = capsys.readouterr().out
    assert "kill_detect_s" in printed and "freeze_detect_s" in printed
    data = json.loads(out.read_text())
    for key in (
        "heartbeat_interval_s", "kill_detect_s", "freeze_detect_s", "gateway_requests", "gateway_errors",
        "max_gap_s", "targets", "met", "events", "chunks_fully_owned_after_kill", "timeline", "errors",
    ):  # fmt: skip
        assert key in data, key
    assert rc == 0 and data["errors"] == []
    assert data["targets"] == TARGETS == {"kill_detect_s": 1.0, "freeze_detect_s": 3.5, "gateway_errors": 0}
    assert data["heartbeat_interval_s"] == 0.5
    assert data["artifact"].startswith("int8-") and data["chunks"] >= 4
    # Last Will: near-instant; freeze: by heartbeat timeout, so at least suspect_after intervals in.
    assert 0 < data["kill_detect_s"] < data["freeze_detect_s"]
    assert 0 < data["freeze_suspect_s"] < data["freeze_detect_s"] < 10
    assert data["gateway_requests"] > 10
    assert 0 <= data["gateway_errors"] <= data["gateway_requests"]
    assert 0 < data["max_gap_s"] < 30
    assert data["chunks_fully_owned_after_kill"] is True
    assert set(data["met"]) == {*TARGETS, "all"}
    assert data["met"]["gateway_errors"] is (data["gateway_errors"] == 0)
    assert data["met"]["all"] is all(data["met"][k] for k in TARGETS)
    killed, frozen = data["killed"], data["frozen"]
    kinds = [(e["type"], e["node_id"]) for e in data["events"]]
    assert ("node_dead", killed) in kinds and ("node_dead", frozen) in kinds and ("node_rejoined", frozen) in kinds
    assert [e["detail"]["reason"] for e in data["events"] if e["node_id"] == killed and e["type"] == "node_dead"] == [
        "last will"
    ]
    assert not list((tmp_path / "fleets").iterdir())
