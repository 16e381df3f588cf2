"""Edge faults with real processes: SIGKILL in the middle of a fetch, of an assembly and of a
version swap; a cache smaller than a version (alone and in a rollout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import diskcache
from _faults import (
    CENTRAL_ENV,
    EDGE_ENV,
    PrefixedFleet,
    SmallDisk,
    assert_edge_files_sound,
    infer,
    mqtt_envs,
    sigkill_edge,
    sigkill_edge_when,
    version,
    wait_until,
)
from diskcache.core import DBNAME

from bench._fleet import Fleet
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker


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

        fleet.stop_edge("e0")  # restarted, it is told to serve v2 only: it serves v1 from its disk
        fleet.start_edge("e0")
        wait_until(lambda: version(fleet, "e0", "mlp", "2").get("state") == "failed", 30, "v2 refused again")
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"


def _answers(fleet: Fleet, node: str, width: int) -> str | None:
    """The version that answers an inference of ``width`` inputs (None while none does)."""
    try:
        return str(infer(fleet, node, "mlp", width)["model_version"])
    except AssertionError:
        return None


def _temp_in(directory: Path, prefix: str) -> Path | None:
    """A non-empty temp file of the edge's version writer in ``directory``, if one is there."""
    try:
        return next((e for e in directory.iterdir() if e.name.startswith(prefix) and e.stat().st_size > 0), None)
    except FileNotFoundError:
        return None


def test_an_edge_killed_during_assembly_never_loads_a_half_written_file(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "mlp.onnx", width=1024, hidden_layers=6)  # ~25 MB, ~400 chunks
    no_hot = {**EDGE_ENV, "MODELFLEET_HOT_CACHE_BYTES": "0"}  # assembly re-reads every chunk from disk
    with Fleet(root=tmp_path, central_env=CENTRAL_ENV, edge_env=no_hot) as fleet:
        fleet.start(edges=1)
        pushed = fleet.push("mlp", "1", model)
        directory = fleet.edges["e0"].data_dir / "versions" / "mlp" / "1" / "fp32"  # <version>/<artifact>
        half = sigkill_edge_when(fleet, "e0", lambda: _temp_in(directory, ".assemble-"), 60, "an assembly")
        assert 0 < half.stat().st_size < pushed.size  # killed with a half-written file on disk ...
        assert not (directory / "model.onnx").exists()  # ... and no model file published

        fleet.start_edge("e0")  # same data and cache dirs
        wait_until(lambda: version(fleet, "e0", "mlp", "1").get("state") == "complete", 60, "the reassembly")
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        assert infer(fleet, "e0", "mlp", 1024)["model_version"] == "1"
        fleet.stop_edge("e0")
        assert_edge_files_sound(fleet, "e0", "mlp", "1", pushed.manifest)  # the leftover temp file is gone


def test_an_edge_killed_during_a_version_swap_comes_back_serving_the_new_version(tmp_path: Path) -> None:
    v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=32, hidden_layers=1, seed=1)
    with Fleet(root=tmp_path, central_env=CENTRAL_ENV, edge_env=EDGE_ENV) as fleet:
        fleet.start(edges=1)
        fleet.push("mlp", "1", v1)
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"

        pushed = fleet.push("mlp", "2", v2)
        marker = fleet.edges["e0"].data_dir / "versions" / "mlp" / "2" / "fp32" / "manifest.json"
        # The marker is written as the version completes and the swap starts: session build,
        # warm-up, switch, then v1 answers stragglers for retire_grace_s (5 s) before it goes.
        sigkill_edge_when(fleet, "e0", lambda: marker if marker.exists() else None, 30, "v2 assembled")
        assert fleet.dir is not None
        log = (fleet.dir / "logs" / "e0.err").read_text()
        assert "mlp version 1 retired" not in log  # killed before the swap was over

        fleet.start_edge("e0")
        wait_until(lambda: version(fleet, "e0", "mlp", "2").get("state") == "complete", 30, "v2 complete again")
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        assert infer(fleet, "e0", "mlp", 32)["model_version"] == "2"
        fleet.stop_edge("e0")
        assert_edge_files_sound(fleet, "e0", "mlp", "2", pushed.manifest)


def test_a_rollout_to_an_edge_whose_cache_is_too_small_rolls_back_with_the_reason(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    small = build_mlp(tmp_path / "small.onnx", width=32, hidden_layers=1)
    large = build_mlp(tmp_path / "large.onnx", width=384, hidden_layers=4)  # ~2.7 MB
    central_mqtt, edge_mqtt = mqtt_envs(mosquitto)
    tiny_cache = {**EDGE_ENV, **edge_mqtt, "MODELFLEET_CACHE_BYTES": str(1024 * 1024)}
    with Fleet(root=tmp_path, central_env={**CENTRAL_ENV, **central_mqtt}, edge_env=tiny_cache) as fleet:
        fleet.start(edges=1)
        fleet.push("mlp", "1", small)
        fleet.wait_model_ready("e0", "mlp", timeout_s=30)
        assert fleet.central is not None
        models = f"{fleet.central.http_url}/api/v1/models/mlp"
        pushed = fleet.client.post(f"{models}/versions", params={"version": "2", "activate": "false"},
                                   content=large.read_bytes())  # fmt: skip
        assert pushed.status_code == 201, pushed.text
        started = fleet.client.post(f"{models}/rollouts", json={"version": "2", "canary": 1.0})
        assert started.status_code == 201, started.text

        def rollout() -> dict[str, Any]:
            doc: dict[str, Any] = fleet.client.get(f"{models}/rollout").json()
            return doc

        wait_until(lambda: rollout()["state"] == "rolled_back", 30, "the rollout rolled back")
        assert "e0: cache too small" in rollout()["reason"]  # the edge's reason, through its heartbeats
        assert rollout()["failures"]["e0"]["reason"] == "cache_too_small"
        assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"
        assert fleet.edge_status("e0")["cache"]["bytes"] <= 1024 * 1024


def test_a_full_disk_fails_the_new_version_clearly_keeps_serving_and_recovers_once_there_is_room(
    tmp_path: Path,
) -> None:
    small = build_mlp(tmp_path / "small.onnx", width=32, hidden_layers=1)  # a few KiB
    large = build_mlp(tmp_path / "large.onnx", width=384, hidden_layers=4)  # ~2.4 MB, 32 chunks
    big_cap = {**EDGE_ENV, "MODELFLEET_CACHE_BYTES": str(256 * 1024 * 1024)}  # the setting does not protect it
    with PrefixedFleet(root=tmp_path, central_env=CENTRAL_ENV, edge_env=big_cap) as fleet:
        assert fleet.dir is not None
        data_dir = fleet.dir / "edges" / "e0"  # the edge's data dir, its cache and versions in it
        with SmallDisk(data_dir, 1024 * 1024) as disk:  # 1 MiB: v1 fits, v2's chunks do not
            fleet.prefixes["e0"] = disk.prefix
            fleet.start(edges=1)
            fleet.push("mlp", "1", small)
            fleet.wait_model_ready("e0", "mlp", timeout_s=30)
            pushed = fleet.push("mlp", "2", large)

            def error() -> str:
                return str(version(fleet, "e0", "mlp", "2").get("error") or "")

            wait_until(lambda: "no space left on device" in error(), 30, "v2 failing for want of room")
            assert (version(fleet, "e0", "mlp", "2")["state"], version(fleet, "e0", "mlp", "2")["reason"]) == (
                "failed",
                "disk",
            )
            assert "cannot store chunk" in error() and str(data_dir / "cache") in error(), error()
            assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"  # still serving what it has

            fleet.stop_edge("e0")  # restarted on the full disk, told to serve v2 only: v1 from its disk
            fleet.start_edge("e0")
            wait_until(lambda: "no space left on device" in error(), 30, "v2 failing again after a restart")
            fleet.wait_model_ready("e0", "mlp", timeout_s=30)
            assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"
            disk.resize(3584 * 1024)  # 3.5 MiB: room for v2's chunks, not for its assembled copy too
            wait_until(lambda: "cannot write mlp:2" in error(), 30, "v2's assembly failing for want of room")
            assert version(fleet, "e0", "mlp", "2")["state"] == "failed"
            assert version(fleet, "e0", "mlp", "2")["reason"] == "disk"
            assert str(data_dir / "versions" / "mlp" / "2") in error(), error()
            leftovers = list(disk.host_path(data_dir / "versions" / "mlp" / "2" / "fp32").iterdir())
            assert [p.name for p in leftovers] == []  # no temp file, no model file without its manifest
            assert infer(fleet, "e0", "mlp", 32)["model_version"] == "1"

            disk.resize(16 * 1024 * 1024)  # room at last: the retries complete v2, nothing restarted
            wait_until(lambda: version(fleet, "e0", "mlp", "2").get("state") == "complete", 30, "v2 complete")
            wait_until(lambda: _answers(fleet, "e0", 384) == "2", 30, "v2 served")
            assert fleet.edges["e0"].alive()
            fleet.stop_edge("e0")
            for run in sorted((fleet.dir / "logs").glob("e0*.err")):  # before and after the restart
                log = run.read_text()
                assert len([line for line in log.splitlines() if " ERROR " in line]) == 1, log  # one clear line
                assert "Traceback" not in log and "never retrieved" not in log, log
            copy = disk.copy_out(data_dir, tmp_path / "e0-copy")  # SQLite cannot open it through /proc
        assert_edge_files_sound(fleet, "e0", "mlp", "2", pushed.manifest, data_dir=copy)
        for part in ("pinned", "lru"):  # no value file left behind by a failed write
            directory = copy / "cache" / part
            files = [p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(DBNAME)]
            with diskcache.Cache(str(directory)) as entries:
                assert len(files) == len(entries), (part, len(files), len(entries))
