"""The language-model bench runs end to end at a tiny size (a central and an edge process, the
tiny random Llama, a few streams) and writes every key of the issue with the CPU flags; the
figures at this size say nothing about speed, but the run must be clean: no error, no slot left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate import TARGETS, main


def test_generate_bench_measures_every_key_over_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "generate.json"
    args = ["--json", str(out), "--shape", "tiny", "--tokens", "8", "--clients", "3", "--prefix", "48",
            "--cancel", "4", "--work-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert all(key in printed for key in TARGETS)
    data = json.loads(out.read_text())
    assert data["cpu_flags"] and data["shape"] == "tiny" and set(data["met"]) == set(TARGETS)
    assert data["errors"] == 0 and data["leaked_slots"] == 0, data["measured"]["errors"]
    assert all(data[key] is not None and data[key] > 0 for key in TARGETS if key not in ("errors", "leaked_slots"))
    measured = data["measured"]
    assert measured["int4_tokens_s"] > 0 and measured["fp32_tokens_s"] > 0 and measured["clients_tokens_s"] > 0
    assert data["genai"]["single_tokens_s"] > 0 and data["genai"]["batch_tokens_s"] > 0
    # the trained zoo model's served artifact keeps the text guard's bounds
    assert data["met"]["perplexity_ratio"] and data["met"]["greedy_agreement"]
