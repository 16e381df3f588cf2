"""Edge faults with real processes: SIGKILL in the middle of a fetch, a cache smaller than a version."""

from __future__ import annotations

from pathlib import Path

from _faults import CENTRAL_ENV, EDGE_ENV, assert_edge_files_sound, sigkill_edge, version, wait_until

from bench._fleet import Fleet
from modelfleet.zoo import build_mlp


def test_an_edge_killed_mid_fetch_resumes_and_serves_exactly_the_pushed_file(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "mlp.onnx", width=384, hidden_layers=4)  # ~2.7 MB, ~40 chunks
    slow = {**CENTRAL_ENV, "MODELFLEET_ORIGIN__EGRESS_BYTES_S": "1000000"}  # the fetch takes ~3 s
    with Fleet(root=tmp_path, central_env=slow, edge_env=EDGE_ENV) as fleet:
        fleet.start(edges=1)
        pushed = fleet.push("mlp", "1", model)
        total = len({c["digest"] for c in pushed.manifest["chunks"]})
        wait_until(lambda: fleet.edge_status("e0")["cache"]["entries"] >= total // 4, 30, "a quarter cached")
        assert version(fleet, "e0", "mlp", "1").get("state") != "complete"
        sigkill_edge(fleet, "e0")

        fleet.start_edge("e0")  # same data and cache dirs
        wait_until(lambda: version(fleet, "e0", "mlp", "1").get("state") == "complete", 60, "the resumed fetch")
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        fetch = fleet.edge_status("e0")["fetch"]
        assert fetch["cache_hits"] >= total // 4  # what the killed run cached was reused ...
        assert 0 < fetch["bytes_fetched"] < pushed.size  # ... and only the rest fetched
        fleet.stop_edge("e0")
        assert_edge_files_sound(fleet, "e0", "mlp", "1", pushed.manifest)
