"""The distribution bench runs three tiny fleets of real processes end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.distribution import main


def test_distribution_bench_writes_sane_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dist.json"
    argv = [
        "--json", str(out), "--edges", "2", "--model-mb", "2", "--egress-mb-s", "20", "--chunk-avg-kb", "64",
        "--work-dir", str(tmp_path / "fleets"), "--model-cache", str(tmp_path / "models"), "--timeout-s", "60",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "placement" in printed and "naive" in printed and "single" in printed
    data = json.loads(out.read_text())
    for key in (
        "edges", "model_bytes", "origin_bytes", "origin_ratio", "naive_origin_ratio", "rollout_s",
        "naive_rollout_s", "single_edge_rollout_s", "egress_cap_bytes_s", "targets", "rollout_over_single", "met",
    ):  # fmt: skip
        assert key in data, key
    assert data["edges"] == 2
    assert data["model_bytes"] >= 2_000_000
    assert data["egress_cap_bytes_s"] == 20_000_000
    assert data["targets"] == {"origin_ratio": 1.10, "rollout_over_single": 1.5}
    assert set(data["met"]) >= {"origin_ratio", "rollout_over_single"}
    assert all(isinstance(v, bool) for v in data["met"].values())
    # Placement: each chunk leaves central about once; naive: once per edge.
    assert 0.99 <= data["origin_ratio"] <= 1.10
    assert data["naive_origin_ratio"] == pytest.approx(2.0, abs=0.05)
    assert data["origin_bytes"] == pytest.approx(data["origin_ratio"] * data["model_bytes"])
    assert data["rollout_s"] > 0 and data["naive_rollout_s"] > 0 and data["single_edge_rollout_s"] > 0
    assert data["rollout_over_single"] == pytest.approx(data["rollout_s"] / data["single_edge_rollout_s"])
    assert data["met"]["files_verified"] is True
    runs = data["runs"]
    assert [(k, runs[k]["edges"]) for k in ("placement", "naive", "single")] == [
        ("placement", 2), ("naive", 2), ("single", 1)
    ]  # fmt: skip
    for run in runs.values():
        assert len(run["per_edge"]) == run["edges"]
        for edge in run["per_edge"].values():
            assert edge["file_verified"] is True
            assert edge["bytes_from_origin"] + edge["bytes_from_peers"] >= data["model_bytes"]
            assert not edge["rejected_corrupt"]
    # Naive: nothing came from peers.
    assert all(e["bytes_from_peers"] == 0 for e in runs["naive"]["per_edge"].values())
    # The fleets cleaned up after themselves.
    assert not list((tmp_path / "fleets").iterdir())
