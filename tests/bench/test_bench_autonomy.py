"""The autonomy bench runs end to end at a tiny size and writes sane figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.autonomy import TARGETS, main


@pytest.mark.timeout(240)
def test_autonomy_bench_writes_sane_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "autonomy.json"
    argv = [
        "--json", str(out), "--edges", "2", "--steady-s", "0.5", "--autonomous-s", "1",
        "--timeout-s", "90", "--work-dir", str(tmp_path / "fleets"),
    ]  # fmt: skip
    rc = main(argv)
    printed = capsys.readouterr().out
    assert "cold_boot_ready_s_p99" in printed and "resync_s" in printed
    data = json.loads(out.read_text())
    assert rc == 0 and data["run_errors"] == [], data.get("log_tails")
    for key in ("edges", "cold_boot_ready_s_p99", "requests", "errors", "resync_s", "targets", "met", "cpu_flags"):
        assert key in data, key
    assert data["edges"] == 2 and data["model"]["artifact"].startswith("int8-")
    # Every edge came back on its own data dir with central and the broker gone, and said so.
    assert set(data["modes_while_away"].values()) == {"autonomous"}
    assert all(0 < v < 90 for v in data["cold_boot_ready_s"].values())
    assert data["requests"] > 10 and 0 <= data["errors"] <= data["requests"]
    assert 0 < data["resync_s"] < 90
    assert data["targets"] == {"all_ready": True, **TARGETS}
    assert set(data["met"]) == {"all_ready", "errors", "resync_s", "all"}
