"""The delta bench: a one-layer change fetches a small fraction of the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.delta import main, new_bytes_ratio


def test_new_bytes_ratio_counts_unseen_bytes_once() -> None:
    old = [("a", 10), ("b", 10)]
    assert new_bytes_ratio(old, [("a", 10), ("b", 10)]) == 0.0
    assert new_bytes_ratio(old, [("a", 10), ("c", 30)]) == pytest.approx(0.75)
    assert new_bytes_ratio(old, [("c", 10), ("c", 10)]) == pytest.approx(0.5)
    assert new_bytes_ratio(old, []) == 0.0


def test_delta_bench_writes_sane_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "delta.json"
    argv = [
        "--json", str(out), "--model-mb", "3", "--chunk-avg-kb", "64",
        "--work-dir", str(tmp_path / "fleets"), "--model-cache", str(tmp_path / "models"), "--timeout-s", "60",
    ]  # fmt: skip
    assert main(argv) == 0
    assert "delta_ratio" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("model_bytes", "delta_bytes_fetched", "delta_ratio", "targets", "met", "fixed_chunk_delta_ratio"):
        assert key in data, key
    assert data["targets"] == {"delta_ratio": 0.15}
    assert data["model_bytes"] >= 3_000_000
    assert 0 < data["delta_bytes_fetched"] < data["model_bytes"]
    assert data["delta_ratio"] == pytest.approx(data["delta_bytes_fetched"] / data["model_bytes"])
    assert data["delta_ratio"] <= 0.15
    assert data["met"]["delta_ratio"] is True
    assert data["v2_file_verified"] is True
    # v1 was fetched in full first; v2 reused all but the changed chunks from the cache.
    assert data["v1_bytes_fetched"] >= data["v1_bytes"]
    assert 1 <= data["v2_new_chunks"] < data["v2_chunks"]
    assert data["v2_cache_hits"] >= data["v2_chunks"] - data["v2_new_chunks"] - 1
    assert 0 < data["fixed_chunk_delta_ratio"] <= 1
    assert data["cdc_delta_ratio_local"] == pytest.approx(data["delta_ratio"], abs=0.02)
    # A shifted header defeats fixed blocks but not content-defined chunks.
    assert data["shifted_fixed_chunk_delta_ratio"] > 0.9
    assert data["shifted_cdc_delta_ratio"] < 0.2
    assert not list((tmp_path / "fleets").iterdir())
