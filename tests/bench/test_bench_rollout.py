"""bench.rollout runs end to end at a tiny size: a staged flip measured on every edge, the cost
preview compared with what the edges fetched, and the INT8 drift part measured or honestly
reported as not available (edge shadow sampling and central's judge may be absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.rollout import TARGETS, main


@pytest.mark.timeout(240)
def test_rollout_bench_writes_sane_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rollout.json"
    argv = [
        "--json", str(out), "--edges", "2", "--interval", "1", "--flip-lead-s", "2", "--width", "96", "--layers", "2",
        "--shadow-sample", "0.1", "--shadow-max-requests", "600", "--timeout-s", "40",
        "--work-dir", str(tmp_path / "fleets"), "--model-cache", str(tmp_path / "models"),
    ]  # fmt: skip
    rc = main(argv)
    printed = capsys.readouterr().out
    assert "flip_skew_s" in printed and "preview_error" in printed and "shadow_detect_requests" in printed
    data = json.loads(out.read_text())
    assert rc == 0 and data["errors"] == [], data.get("log_tails")
    assert data["edges"] == 2 and set(data["sites"].values()) == {"s1", "s2"}
    assert data["targets"] == TARGETS and set(data["met"]) == {*TARGETS, "all"}
    assert isinstance(data["cpu_flags"], list)

    # Part 1: both edges switched, each bracketed, near the instant (same host: clocks agree).
    offsets = data["flip_switch_offsets_s"]
    assert set(offsets) == {"e0", "e1"} and all(v is not None and abs(v) < 2.0 for v in offsets.values())
    assert 0 <= data["flip_skew_s"] <= data["flip_error_s"] * 2 + 2e-4  # each figure is rounded to 0.1 ms
    assert set(data["flip_nodes_staged"].values()) == {"staged"}
    assert all(v is not None and abs(v) < 100 for v in data["clock_offsets_ms"].values())

    # Part 2: a full version and a delta, each previewed and measured on every node.
    full, delta = data["preview_runs"]
    assert full["version_bytes"] > 0 and min(full["measured_bytes"].values()) > 0
    assert sum(delta["measured_bytes"].values()) < sum(full["measured_bytes"].values())  # the delta is smaller
    assert data["preview_error"] == max(full["worst_error"], delta["worst_error"]) >= 0
    assert data["met"]["preview_error"] == (data["preview_error"] <= TARGETS["preview_error"])
    if not any(d for run in (full, delta) for d in run["detours"].values()):  # the preview's own assumption
        assert data["preview_error"] <= TARGETS["preview_error"], (full, delta)

    # Part 3: INT8 was served and the shifted inputs really disagree with FP32 on it.
    assert all(a.startswith("int8-") for a in data["shadow_artifacts_before"].values())
    assert data["shadow_live_agreement"] <= 0.6 and data["shadow_requests_failed"] == 0
    if data["shadow_available"]:
        assert 0 < data["shadow_detect_requests"] <= data["shadow_requests_sent"]
        assert data["shadow_drift_event"]["type"] == "int8_drift"
    else:
        assert "no int8_drift event" in data["shadow_reason"]
        assert data["shadow_detect_requests"] is None and data["fallback_s"] is None
        assert data["met"]["shadow_detect_requests"] is None and data["met"]["fallback_s"] is None
