"""bench._ha_pg_restart at a tiny size: a central on a private PostgreSQL keeps answering
``/healthz`` (every probe 200) while PostgreSQL is stopped and started again under
store-touching traffic, whose requests get 503s (the outage was real) and never another 5xx;
the run reports every key, and ``bench.central_ha --pg-restart`` can carry its figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._ha_pg_restart import TARGETS, main, merge_into


@pytest.mark.timeout(120)
def test_ha_pg_restart_bench_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pg.json"
    argv = ["--down-s", "1", "--settle-s", "0.5", "--probe-hz", "40", "--modes", "threads", "--json", str(out)]
    assert main(argv) == 0, json.loads(out.read_text())["errors"]
    assert "healthz_p99_ms_during_pg_restart" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("healthz_p99_ms_during_pg_restart", "healthz_p99_ms_before", "modes", "cpu_flags", "machine"):
        assert key in data, key
    assert data["targets"] == TARGETS and list(data["modes"]) == ["threads"]
    figures = data["modes"]["threads"]
    assert figures["healthz_probes"] > 20 and figures["healthz_failed"] == 0
    assert figures["store_503"] > 0 and figures["store_500"] == 0, figures
    assert figures["gateway_requests"] > 0 and figures["recovered_s"] < 30
    assert data["healthz_p99_ms_during_pg_restart"] == figures["healthz_p99_ms"] is not None

    ha = {"targets": {"pushes_lost": 0}, "met": {"pushes_lost": True, "all": True}, "errors": []}
    merge_into(ha, data)
    assert ha["targets"]["healthz_p99_ms_during_pg_restart"] == TARGETS["healthz_p99_ms_during_pg_restart"]
    assert ha["healthz_p99_ms_during_pg_restart"] == figures["healthz_p99_ms"]
    assert ha["met"]["all"] == data["met"]["healthz_p99_ms_during_pg_restart"]
