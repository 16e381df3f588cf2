"""The exported-models bench runs end to end on the torch-written fixtures (few rounds,
short sequences) and writes a row per model with what central cleaned and the CPU flags; the
CNN, pushed with 32 images as a user would, is served FP32 with its INT8 pending, then promoted
on (simulated) live traffic at a 1 % sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.exported import FIXTURES, TARGETS, main

ROW_KEYS = {
    "name", "family", "fp32_bytes", "artifact", "normalized", "kept_fp32", "size_ratio", "speedup_b1", "speedup_b8",
    "fp32_ms_b8", "served_ms_b8", "guard", "error", "pushed_artifact", "int8_status", "live",
}  # fmt: skip


def test_exported_bench_quantizes_every_fixture_and_reports_speedups_with_cpu_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "exported.json"
    assert main(["--json", str(out), "--rounds", "2", "--free-dim", "8", "--work-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert all(key in printed for key in TARGETS)
    data = json.loads(out.read_text())
    assert data["targets"] == TARGETS and data["cpu_flags"] and data["cpu_kind"] and data["free_dim"] == 8
    rows = {r["name"]: r for r in data["models"]}
    assert set(rows) == {p.name for p in FIXTURES.iterdir()} == {"bert", "bert-opset23", "cnn"}
    for row in rows.values():
        assert set(row) >= ROW_KEYS and row["error"] is None
        assert row["artifact"].startswith("int8-") and row["size_ratio"] < 0.5
        assert row["speedup_b1"] > 0 and row["speedup_b8"] > 0
    assert rows["bert"]["normalized"] and rows["cnn"]["normalized"] is None
    assert rows["bert-opset23"]["kept_fp32"]
    assert data["bert_model"] == "bert" and data["bert_speedup_b8"] == rows["bert"]["speedup_b8"]
    assert rows["bert"]["live"] is None and rows["bert"]["int8_status"] == "served"
    cnn = rows["cnn"]
    assert cnn["int8_status"] == "unproven" and cnn["pushed_artifact"] == "fp32"
    live = cnn["live"]
    assert live["decision"] == "int8_promoted" and live["candidate"] == cnn["artifact"]
    assert live["evidence"]["proven"] and live["evidence"]["measures"]["top1"]["lower_bound"] >= 0.97
    assert 0 < live["sampled_requests"] < live["requests"] == live["promotion_requests"] == data["promotion_requests"]
    assert data["exported_pushes_served"] == 2 and data["exported_cnn_speedup_b8"] == cnn["speedup_b8"]


def test_a_directory_without_a_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", str(tmp_path / "x.json"), "--model", str(tmp_path)]) == 2
    assert "no model.onnx" in capsys.readouterr().err
