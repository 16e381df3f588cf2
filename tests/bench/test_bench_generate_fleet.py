"""The fleet-sized language-model bench runs end to end at a tiny size (Mosquitto, central and
three edges as processes; a 16-layer random Llama of a few MB): a staged language model reaches
every edge with its tokenizer and config byte for byte, each chunk leaving central once, and a
fine-tune of 2 of its 16 layers moves only a fraction of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate_fleet import TARGETS, main


def test_generate_fleet_bench_measures_distribution_and_finetune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "generate_fleet.json"
    args = ["--json", str(out), "--shape", "tiny", "--layers", "16", "--edges", "3", "--finetune-edges", "3",
            "--chunk-avg-kb", "32", "--timeout-s", "60", "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert all(key in printed for key in TARGETS)
    data = json.loads(out.read_text())
    assert data["cpu_flags"] and data["sections"] == ["distribution", "finetune"]
    assert set(data["met"]) == set(TARGETS) and data["errors"] == 0
    dist = data["distribution"]
    assert dist["kind"] == "decoder" and dist["all_files_verified"]
    assert {"model.onnx.data", "tokenizer.json", "genai_config.json"} <= set(dist["files"])
    # placement and peers: about one copy of each chunk leaves central for three edges
    assert data["llm_origin_ratio"] == pytest.approx(dist["origin_bytes"] / dist["model_bytes"])
    assert 0.9 < data["llm_origin_ratio"] <= TARGETS["llm_origin_ratio"]
    ft = data["finetune"]
    assert ft["all_files_verified"] and ft["changed_layers"] == [3, 9] and ft["layers"] == 16
    assert len(ft["per_edge_bytes"]) == 3 and all(b > 0 for b in ft["per_edge_bytes"].values())
    # what moved is the changed layers and their boundary chunks, no more than the manifests differ by
    assert ft["changed_tensor_ratio"] <= ft["finetune_delta_ratio"] <= ft["cdc_new_bytes_ratio"] + 0.01
    assert data["finetune_delta_ratio"] < 0.3
    assert not any((tmp_path / "work").iterdir())  # fleets and models removed
