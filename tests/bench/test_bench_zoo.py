"""The zoo bench runs end to end on the small trained models and writes consistent figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.zoo import TARGETS, main, summarize
from modelfleet.zoo.cache import CACHE_ENV

ROW_KEYS = {
    "name", "family", "fp32_bytes", "artifact", "size_ratio", "speedup_b1", "speedup_b8", "fp32_accuracy",
    "served_accuracy", "accuracy_delta_pp", "guard", "choice",
}  # fmt: skip


def test_zoo_bench_writes_a_row_per_model_with_the_edges_choice(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "zoo.json"
    argv = ["--json", str(out), "--models", "mlp-digits,resnet-digits", "--rounds", "3", "--choice-budget-s", "0.5"]
    assert main([*argv, "--work-dir", str(tmp_path)]) == 0
    assert "cnn_speedup_b8" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["targets"] == TARGETS and data["cpu_flags"] and set(data["met"]) == set(TARGETS)
    rows = {r["name"]: r for r in data["models"]}
    assert set(rows) == {"mlp-digits", "resnet-digits"}
    for row in rows.values():
        assert set(row) >= ROW_KEYS
        assert row["guard"]["verdict"] == "passed"
        # The edge serves FP32 or an artifact the guard passed; its accuracy is measured, not copied.
        assert row["artifact"] == "fp32" or row["artifact"] in row["guard"]["candidates"]
        assert row["fp32_accuracy"] > 0.95 and abs(row["accuracy_delta_pp"]) <= 5
        assert (row["size_ratio"] == 1.0) == (row["artifact"] == "fp32")
    assert data["cnn_model"] == "resnet-digits" and data["transformer_speedup_b8"] is None


def test_summary_takes_the_largest_model_of_each_family_and_judges_every_target() -> None:
    def row(name: str, family: str, size: int, b1: float, b8: float | None, delta: float | None) -> dict[str, object]:
        return {"name": name, "family": family, "fp32_bytes": size, "speedup_b1": b1, "speedup_b8": b8,
                "trained": delta is not None, "accuracy_delta_pp": delta}  # fmt: skip

    summary = summarize(
        [
            row("small-cnn", "cnn", 10, 1.0, 1.1, 0.2),
            row("big-cnn", "cnn", 100, 1.9, 1.8, None),
            row("tf", "transformer", 50, 0.98, 1.6, 1.4),
        ]
    )
    assert summary["cnn_speedup_b8"] == 1.8 and summary["cnn_model"] == "big-cnn"
    assert summary["transformer_speedup_b8"] == 1.6
    assert summary["min_speedup"] == 0.98 and summary["max_accuracy_delta_pp"] == 1.4
    assert summary["met"] == {
        "min_speedup": False, "cnn_speedup_b8": True, "transformer_speedup_b8": True, "max_accuracy_delta_pp": False,
    }  # fmt: skip
