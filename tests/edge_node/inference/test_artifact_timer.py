"""The artifact timer times real ONNX Runtime sessions of artifacts whose speeds differ tenfold and
more, so the choice is deterministic; the rules of the pick are checked on given timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_node.inference.artifact_timer import ArtifactTimer, Timing, pick, timing_inputs
from edge_node.inference.hardware import detect_hardware
from edge_node.inference.session import SessionFactory
from edge_node.settings import ChoiceSettings, EdgeSettings
from fleetwire.manifest import TensorSpec
from support.artifact_models import build_fast, build_fp32, build_slow

QUICK = ChoiceSettings(budget_s=1.0, min_rounds=3, max_rounds=8)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("artifacts")
    return {
        "fp32": build_fp32(d / "fp32.onnx"),
        "int8-fast": build_fast(d / "fast.onnx"),
        "int8-slow": build_slow(d / "slow.onnx"),
    }


def _timer(tmp_path: Path, hardware_class: str = "x86_64/avx2/2c/cpu") -> ArtifactTimer:
    factory = SessionFactory(tmp_path / "ort-cache", ["CPUExecutionProvider"])
    return ArtifactTimer(factory, hardware_class, "edge-a", QUICK)


def _candidates(artifacts: dict[str, Path], *names: str) -> dict[str, tuple[Path, str]]:
    return {n: (artifacts[n], f"sha-{n}") for n in names}


def test_the_fastest_artifact_wins_with_its_measured_speedups(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    choice = _timer(tmp_path).choose(_candidates(artifacts, "fp32", "int8-slow", "int8-fast"))
    assert choice.artifact == "int8-fast"
    assert choice.source == "measured" and choice.reason == "fastest of 3 on this node"
    assert choice.hardware_class == "x86_64/avx2/2c/cpu" and choice.from_node == "edge-a"
    assert choice.speedup_b1 is not None and choice.speedup_b1 > 1.0
    assert choice.speedup_b8 is not None and choice.speedup_b8 > 1.0


def test_an_artifact_slower_than_fp32_is_never_chosen(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    timer = _timer(tmp_path)
    choice = timer.choose(_candidates(artifacts, "fp32", "int8-slow"))
    assert choice.artifact == "fp32"
    assert (choice.speedup_b1, choice.speedup_b8) == (1.0, 1.0)
    # The loser's optimized copy is removed from the session cache; the winner's stays for the load.
    assert timer._factory.entry_files("sha-int8-slow") == []  # its data file too
    assert timer._factory.cache_path("sha-fp32").exists()


def test_a_candidate_that_does_not_load_is_left_out(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    candidates = {**_candidates(artifacts, "fp32"), "int8-broken": (broken, "sha-broken")}
    assert _timer(tmp_path).choose(candidates).artifact == "fp32"


def test_without_fp32_there_is_nothing_to_compare_with(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="FP32"):
        _timer(tmp_path).choose(_candidates(artifacts, "int8-fast"))


def _t(artifact: str, b1: float, b8: float | None) -> Timing:
    return Timing(artifact, b1, b8)


def test_pick_needs_the_margin_at_every_batch_size() -> None:
    timings = {
        "fp32": _t("fp32", 1.0, 8.0),
        "int8-a": _t("int8-a", 0.5, 8.4),  # 2x at batch 1, slower at batch 8: out
        "int8-b": _t("int8-b", 0.98, 7.9),  # within noise of FP32: out
        "int8-c": _t("int8-c", 0.8, 6.0),
    }
    choice = pick(timings, "c", "n", min_speedup=1.05)
    assert choice.artifact == "int8-c" and choice.speedup_b1 == 1.25 and choice.speedup_b8 == pytest.approx(1.333)
    del timings["int8-c"]
    assert pick(timings, "c", "n", min_speedup=1.05).artifact == "fp32"


def test_pick_without_batch_8_compares_batch_1() -> None:
    timings = {"fp32": _t("fp32", 1.0, None), "int8": _t("int8", 0.5, None)}
    choice = pick(timings, "c", "n", min_speedup=1.05)
    assert (choice.artifact, choice.speedup_b1, choice.speedup_b8) == ("int8", 2.0, None)


def test_timing_inputs_follow_the_signature() -> None:
    specs = [
        TensorSpec(name="ids", dtype="int64", shape=[-1, -1]),
        TensorSpec(name="mask", dtype="int64", shape=[-1, -1]),
        TensorSpec(name="image", dtype="float32", shape=[-1, 3, 8, 8]),
        TensorSpec(name="fixed", dtype="float32", shape=[2, -1]),
    ]
    inputs = timing_inputs(specs, batch=8, free_dim=32)
    assert inputs["ids"].shape == (8, 32) and inputs["ids"].dtype == np.int64 and (inputs["ids"] == 1).all()
    assert (inputs["mask"] == 1).all()  # every position attended
    assert inputs["image"].shape == (8, 3, 8, 8) and inputs["image"].dtype == np.float32
    assert inputs["fixed"].shape == (2, 32)


def test_the_hardware_class_names_int8_flags_cores_and_provider() -> None:
    hw = detect_hardware(["CPUExecutionProvider"], cpu_flags="fpu sse4_2 avx2 avx512f avx512_vnni amx_tile")
    assert hw.flags == ("avx2", "avx512f", "avx512_vnni")
    assert str(hw).endswith(f"/avx2+avx512f+avx512_vnni/{hw.cores}c/cpu")
    arm = detect_hardware(["CPUExecutionProvider"], cpu_flags="fp asimd asimddp i8mm", intra_op_threads=1)
    assert arm.flags == ("neon", "dotprod", "i8mm") and arm.cores == 1
    gpu = detect_hardware(["CUDAExecutionProvider", "CPUExecutionProvider"], cpu_flags="")
    assert str(gpu).split("/")[1:] == ["base", f"{gpu.cores}c", "cuda"]


def test_the_cpu_flags_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_INFERENCE__CPU_FLAGS", "avx2 avx512_vnni")
    flags = EdgeSettings(node_id="n").inference.cpu_flags
    assert detect_hardware(["CPUExecutionProvider"], flags).flags == ("avx2", "avx512_vnni")
