"""The in-process engine bench runs end to end at the tiny shape (FP32 and int4 written by the
zoo's writer and central's quantizer, the engine beside onnxruntime-genai) and writes every
figure with the CPU flags. Its loaded-TTFT round once waited forever when streams were too short
to ever fill the batch; at this size they are."""

from __future__ import annotations

import json
from pathlib import Path

from bench.generate_engine import main


def test_engine_bench_measures_engine_and_genai_on_the_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    args = ["--shape", "tiny", "--workdir", str(tmp_path), "--tokens", "4", "--prompt", "8", "--prefix", "40",
            "--clients", "3", "--repeats", "1", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["cpu_flags"] and data["clients"] == 3 and set(data["met"]) == set(data["targets"])
    for key in ("engine_single_tps", "engine_aggregate_tps", "genai_single_tps", "fp32_single_tps"):
        assert data[key] > 0, key
    assert data["ttft_loaded_s"] > 0 and data["prefix_ttft_cold_s"] > 0 and data["prefix_ttft_cached_s"] > 0
