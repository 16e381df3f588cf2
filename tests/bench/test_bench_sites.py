"""bench.sites runs tiny fleets of real processes across simulated sites (root, ``ip netns``, ``tc``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._netns import available
from bench.sites import main


def test_sites_bench_measures_every_wan_link_and_verifies_every_edge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if (reason := available()) is not None:
        pytest.skip(reason)
    out = tmp_path / "sites.json"
    argv = [
        "--json", str(out), "--sites", "2", "--edges-per-site", "2", "--model-mb", "2", "--chunk-avg-kb", "64",
        "--wan-mb-s", "20", "--wan-delay-ms", "5", "--skip-distribution", "--timeout-s", "60",
        "--work-dir", str(tmp_path / "fleets"), "--model-cache", str(tmp_path / "models"),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "site_aware" in printed and "baseline" in printed and "single" in printed
    data = json.loads(out.read_text())
    assert data["errors"] == []
    assert (data["sites"], data["edges_per_site"]) == (2, 2)
    assert data["model_bytes"] >= 2_000_000
    assert data["runs"]["site_aware"]["pushed_bytes"] == data["model_bytes"]  # one fp32 file, no repeated chunk
    for key in (
        "wan_ratio_max", "origin_ratio", "rollout_s", "single_edge_rollout_s", "baseline_wan_ratio_max",
        "baseline_rollout_s", "baseline_origin_ratio", "rollout_over_single",
    ):  # fmt: skip
        assert data[key] > 0, key
    assert set(data["wan_bytes_in"]) == set(data["baseline_wan_bytes_in"]) == {"s1", "s2"}
    # Every edge holds the whole model, and all of it came into its site over the WAN link.
    assert min(data["wan_bytes_in"].values()) >= data["model_bytes"]
    assert data["wan_ratio_max"] == pytest.approx(max(data["wan_bytes_in"].values()) / data["model_bytes"])
    assert data["origin_ratio"] >= 0.99  # central sent every chunk at least once
    assert data["targets"] == {"wan_ratio_max": 1.10, "origin_ratio": 1.10, "rollout_over_single": 1.5}
    assert set(data["met"]) == {"wan_ratio_max", "origin_ratio", "rollout_over_single", "files_verified"}
    assert data["met"]["files_verified"] is True and data["all_files_verified"] is True
    assert "distribution" not in data
    assert isinstance(data["cpu_flags"], list)
    runs = data["runs"]
    assert {label: r["edges"] for label, r in runs.items()} == {"site_aware": 4, "baseline": 4, "single": 1}
    for r in runs.values():
        assert len(r["files_verified"]) == r["edges"] and all(r["files_verified"].values())
        assert r["central_wan_bytes_out"] >= r["origin_bytes"]  # what central sent crossed hq's WAN link
    assert not list((tmp_path / "fleets").iterdir())  # the fleets cleaned up
