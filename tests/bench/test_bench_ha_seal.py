"""bench._ha_seal at a tiny size: both forms seal a fleet-wide change (every sampled seal opens
for its node, inside the run), and the run reports every key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._ha_seal import TARGETS, main


def test_ha_seal_bench_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seal.json"
    assert main(["--nodes", "40", "--repeats", "2", "--json", str(out)]) == 0
    assert "seal_cpu_s_per_change" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in (
        "seal_cpu_s_per_change", "seal_cpu_s_per_change_old", "seal_cpu_s_per_change_cold", "speedup",
        "build_s_per_change", "build_s_per_change_old",
        "seal_cpu_us_per_join", "seal_cpu_us_per_join_old", "edge_open_us", "edge_open_us_old",
        "proof_bytes_mean", "signatures_per_change", "state_ready_s_p50", "state_ready_s_p50_old", "cpu_flags",
        "machine", "met",
    ):  # fmt: skip
        assert key in data, key
    assert data["nodes"] == 40 and data["targets"] == TARGETS and not data["errors"]
    assert len(data["seal_cpu_s_per_change_runs"]) == len(data["seal_cpu_s_per_change_old_runs"]) == 2
    assert data["seal_cpu_s_per_change_old"] > 0 and data["seal_cpu_s_per_change"] > 0
    assert len(data["build_s_per_change_runs"]) == len(data["build_s_per_change_old_runs"]) == 2
    # 40 leaves: paths of 5 or 6 hashes (the tree is 6 deep), and the streams' states were sealed in batches.
    assert 5 * 32 <= data["proof_bytes_mean"] <= 6 * 32
    assert 1 <= data["signatures_per_change"] < 40


def test_ha_seal_bench_refuses_an_empty_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "0"]) == 2
    assert "--nodes" in capsys.readouterr().out
