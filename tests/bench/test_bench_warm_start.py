"""The warm-start bench runs end to end at a tiny size and writes sane figures; its size
section shows a warm restart re-hashing none of the model, and all of it when told to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
        "--work-dir", str(tmp_path / "fleets"), "--big-mb", "8", "--big-timeout-s", "60",
    ]  # fmt: skip
    rc = main(argv)
    printed = capsys.readouterr().out
    assert "ratio (warm/cold)" in printed and "overhead (warm/floor)" in printed and "8 MiB table" in printed
    data = json.loads(out.read_text())
    for key in (
        "cold_ready_s", "warm_ready_s", "ratio", "targets", "met", "breakdown", "healthz_floor_s", "artifact",
        "floor_s", "overhead_ratio", "cpu_flags", "machine",
    ):  # fmt: skip
        assert key in data, key
    assert data["targets"] == TARGETS == {"ratio": 0.2, "overhead_ratio": 1.5, "big_over_small": 1.5}
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
    _check_size_section(data)
    assert not list((tmp_path / "fleets").iterdir())


def _check_size_section(data: dict[str, Any]) -> None:
    """Each warm start trusted its records (no model byte re-hashed); each re-hashing one read
    the whole model; the ratios are the medians' quotients."""
    assert data["big_mb"] == 8
    for part in ("small", "big"):
        section = data["size"][part]
        runs = section["runs"]
        assert runs["cold"]["version_state"] == "complete" and runs["cold"]["stop_rc"] == 0
        for warm in runs["warm"]:
            assert warm["fetch"].get("bytes_fetched") == 0, "a warm start fetched chunks again"
            assert warm["verification"]["bytes_rehashed"] == 0, "a warm start re-read an unchanged model"
            assert warm["verification"]["bytes_trusted"] == section["model_bytes"]
        for rehash in runs["warm_rehash"]:
            assert rehash["verification"]["bytes_rehashed"] == section["model_bytes"]
            assert rehash["verification"]["bytes_trusted"] == 0
    assert data["size"]["big"]["model_bytes"] >= 8 * 1024 * 1024 > data["size"]["small"]["model_bytes"]
    assert data["big_warm_bytes_rehashed"] == 0
    assert data["big_warm_rehash_bytes_rehashed"] == data["size"]["big"]["model_bytes"]
    if data["errors"] == []:
        assert data["big_over_small"] == pytest.approx(data["big_warm_ready_s"] / data["small_warm_ready_s"])
        assert data["big_over_small_rehash"] == pytest.approx(
            data["big_warm_rehash_ready_s"] / data["small_warm_rehash_ready_s"]
        )
        assert data["met"]["big_over_small"] is (data["big_over_small"] <= 1.5)
