"""Edge faults with real processes: SIGKILL in the middle of a fetch, a cache smaller than a version."""

from __future__ import annotations

from pathlib import Path

from _faults import CENTRAL_ENV, EDGE_ENV, assert_edge_files_sound, infer, sigkill_edge, version, wait_until

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


def test_a_version_larger_than_the_cache_fails_clearly_and_the_old_one_keeps_serving(tmp_path: Path) -> None:
    small = build_mlp(tmp_path / "small.onnx", width=32, hidden_layers=1)  # a few KiB
    large = build_mlp(tmp_path / "large.onnx", width=384, hidden_layers=4)  # ~2.7 MB
    tiny_cache = {**EDGE_ENV, "MODELFLEET_CACHE_BYTES": str(1024 * 1024)}  # the smallest cap allowed
    with Fleet(root=tmp_path, central_env=CENTRAL_ENV, edge_env=tiny_cache) as fleet:
        fleet.start(edges=1)
        fleet.push("mlp", "1", small)
        wait_until(lambda: version(fleet, "e0", "mlp", "1").get("state") == "complete", 30, "v1 complete")
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)

        fleet.push("mlp", "2", large)
        wait_until(lambda: version(fleet, "e0", "mlp", "2").get("state") in ("failed", "complete"), 30, "v2 settled")
        v2 = version(fleet, "e0", "mlp", "2")
        assert v2["state"] == "failed", v2
        assert "cache" in (v2.get("error") or "").lower(), v2
        assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"  # still serving what it has
        assert fleet.edge_status("e0")["cache"]["bytes"] <= 1024 * 1024
