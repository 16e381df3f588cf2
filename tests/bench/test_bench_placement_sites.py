"""The site-aware placement bench runs end to end: every site gets an owner of every chunk
(one crossing per site), which one ring does not give."""

from __future__ import annotations

import json
from pathlib import Path

from bench.placement_sites import main


def test_bench_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert main(["--json", str(out), "--layouts", "4x2,2+3+6", "--chunks-per-node", "16"]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [c["sites"] for c in cases] == [[4, 4], [2, 3, 6]]
    for case in cases:
        assert case["crossings_per_chunk"] == len(case["sites"])
        assert case["one_ring_crossings_per_chunk"] > case["crossings_per_chunk"]
        assert 1.0 <= case["worst_site_max_over_mean"] <= 1.25
        assert 0.0 < case["moved_over_leavers_share"] <= 1.0
        share = case["home_share_over_capacity_share"]
        assert 0.5 < share["min"] <= share["max"] < 1.5
