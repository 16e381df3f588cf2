"""The placement bench runs end to end and writes sane figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.placement import main


def test_bench_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["--json", str(out), "--sizes", "4,8", "--chunks-per-node", "4,8"]) == 0
    assert "max/mean" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["replicas"] == 2
    assert data["load_factor"] == 1.25
    assert data["targets"] == {"max_over_mean": 1.25, "moved_over_ideal": 1.2}
    assert set(data["met"]) == {"max_over_mean", "moved_over_ideal"}
    assert [(c["nodes"], c["chunks_per_node"]) for c in data["cases"]] == [
        (4, 4),
        (4, 8),
        (8, 4),
        (8, 8),
    ]
    for case in data["cases"]:
        n = case["nodes"]
        assert case["ideal_moved_fraction"] == pytest.approx(1 / n)
        assert 1.0 <= case["max_over_mean"] <= case["unbounded_max_over_mean"] + 1e-9
        assert 0.0 < case["moved_fraction_on_leave"] <= case["moved_fraction_on_leave_max"] <= 1.0
        expected = case["moved_fraction_on_leave"] / case["ideal_moved_fraction"]
        assert case["moved_over_ideal"] == pytest.approx(expected)
    assert data["worst_max_over_mean"] == max(c["max_over_mean"] for c in data["cases"])
    assert data["worst_moved_over_ideal"] == max(c["moved_over_ideal"] for c in data["cases"])
