"""The warm-start bench runs end to end at a tiny size and writes sane figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.warm_start import TARGETS, main
from modelfleet.zoo.cache import CACHE_ENV


def test_warm_start_bench_writes_sane_json(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "warm.json"
    argv = [
        "--json", str(out), "--width", "64", "--layers", "2", "--repeats", "1", "--timeout-s", "20",
        "--work-dir", str(tmp_path / "fleets"),
    ]  # fmt: skip
    rc = main(argv)
    printed = capsys.readouterr().out
    assert "ratio (warm/cold)" in printed and "overhead (warm/floor)" in printed
    data = json.loads(out.read_text())
    for key in (
        "cold_ready_s", "warm_ready_s", "ratio", "targets", "met", "breakdown", "healthz_floor_s", "artifact",
        "floor_s", "overhead_ratio", "cpu_flags", "machine",
    ):  # fmt: skip
        assert key in data, key
    assert data["targets"] == TARGETS == {"ratio": 0.2, "overhead_ratio": 1.5}
    assert data["floor_s"] > 0 and len(data["runs"]["floor_s"]) >= 1
    assert isinstance(data["cpu_flags"], list) and data["machine"]
    assert data["model"] == "bench-mlp" and (data["artifact"] == "fp32" or data["artifact"].startswith("int8-"))
    cold = data["runs"]["cold"][0]
    assert cold["error"] is None and cold["version_state"] == "complete"
    assert 0 < cold["healthz_s"] <= cold["ready_s"] == data["cold_ready_s"]
    assert cold["ort_cache_files"], "the cold start wrote no optimized model to the ORT cache"
    assert cold["stop_rc"] == 0 and data["healthz_floor_s"] > 0
    warm = data["runs"]["warm"][0]
    assert warm["healthz_s"] > 0 and warm["version_state"] == "complete"
    assert warm["fetch"].get("bytes_from_origin", 0) == 0, "the warm start fetched chunks again"
    if warm["error"] is None:
        assert rc == 0 and data["errors"] == []
        assert 0 < warm["healthz_s"] <= warm["ready_s"] == data["warm_ready_s"]
        assert data["ratio"] == pytest.approx(data["warm_ready_s"] / data["cold_ready_s"])
        assert data["met"]["ratio"] is (data["ratio"] <= 0.2)
        assert data["overhead_ratio"] == pytest.approx(data["warm_ready_s"] / data["floor_s"])
        assert data["met"]["overhead_ratio"] is (data["overhead_ratio"] <= 1.5)
    else:
        # A restarted edge that never serves its cached model is reported, not hidden.
        assert rc == 1 and data["ratio"] is None and data["met"]["ratio"] is False
        assert data["overhead_ratio"] is None and data["met"]["overhead_ratio"] is False
        assert data["errors"] == [warm["error"]]
    assert not list((tmp_path / "fleets").iterdir())
