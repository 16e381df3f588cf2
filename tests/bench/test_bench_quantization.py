"""The quantization bench runs end to end at a tiny size and writes sane figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.quantization import TARGETS, main
from modelfleet.zoo.cache import CACHE_ENV


def test_bench_writes_json(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "q.json"
    assert main(["--json", str(out), "--width", "64", "--layers", "2", "--iters", "2", "--repeats", "2"]) == 0
    printed = capsys.readouterr().out
    assert "size ratio (INT8/FP32)" in printed and "speedup, batch 32" in printed
    data = json.loads(out.read_text())
    assert (data["width"], data["layers"], data["method"]) == (64, 2, "static")
    assert data["targets"] == TARGETS == {"size_ratio": 0.27, "accuracy_delta_pp": 0.5, "speedup_b32": 3.0}
    assert set(data["met"]) == set(TARGETS)
    assert 0 < data["int8_bytes"] < data["fp32_bytes"]
    assert data["size_ratio"] == pytest.approx(data["int8_bytes"] / data["fp32_bytes"], abs=1e-4)
    for batch in (1, 32):
        assert data[f"fp32_ms_b{batch}"] > 0 and data[f"int8_ms_b{batch}"] > 0
        ratio = data[f"fp32_ms_b{batch}"] / data[f"int8_ms_b{batch}"]
        assert data[f"speedup_b{batch}"] == pytest.approx(
            ratio, rel=0.02, abs=6e-4
        )  # the figure is rounded to 3 decimals
    assert data["fp32_accuracy"] >= 0.95 and data["test_samples"] == 450
    expected = (data["fp32_accuracy"] - data["int8_accuracy"]) * 100
    assert data["accuracy_delta_pp"] == pytest.approx(expected, abs=1e-3)
    assert data["met"]["accuracy_delta_pp"] is (data["accuracy_delta_pp"] <= 0.5)


def test_bench_dynamic_method(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "q.json"
    argv = ["--json", str(out), "--width", "64", "--layers", "2", "--iters", "1", "--repeats", "1"]
    argv += ["--method", "dynamic"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["method"] == "dynamic" and data["per_channel"] is True
