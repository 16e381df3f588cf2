"""The decode timer runs each artifact of a language model as the generation engine does (a
prefilled prompt, then greedy decode steps with the KV cache, alone and 8 at a time) and
gives seconds per step; the artifact timer picks from those by the tensor models' rule and
names every artifact's tokens/s. Folders are the zoo's tiny random Llama and a 4-bit
candidate of it made by central's own weight-only quantizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from central.quantize.llm.weight_only import TEXT_RECIPES, quantize_weights
from edge_node.generation.settings import EngineSettings
from edge_node.inference.artifact_timer import ArtifactTimer
from edge_node.inference.decode_timer import DecodeTimer, tokens_per_s
from edge_node.inference.session import SessionFactory
from edge_node.settings import ChoiceSettings
from modelfleet.zoo.llm import SHAPES, write_random_llm

QUICK = ChoiceSettings(budget_s=0.5, min_rounds=2, max_rounds=3, warmup_runs=1)


def _artifact(source: Path, out: Path, recipe: str | None = None) -> Path:
    """``out`` as a store would assemble an artifact: its graph, and every companion file beside it."""
    out.mkdir(parents=True)
    for path in source.iterdir():
        if recipe is None or not path.name.startswith("model.onnx"):
            shutil.copy(path, out / path.name)
    if recipe is not None:
        quantize_weights(
            source / "model.onnx",
            out / "model.onnx",
            TEXT_RECIPES[recipe],
            accuracy_level=4,
            external_data_bytes=1 << 30,
        )
    return out / "model.onnx"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("llm")
    source = write_random_llm(d / "source", SHAPES["tiny"])
    return {"fp32": _artifact(source, d / "fp32"), "int4-b32": _artifact(source, d / "int4-b32", "int4-b32")}


def test_every_artifact_gets_its_seconds_per_decode_step_alone_and_batched(artifacts: dict[str, Path]) -> None:
    timings = DecodeTimer(EngineSettings(intra_op_threads=1), QUICK).time(artifacts)
    assert set(timings) == {"fp32", "int4-b32"}
    for timing in timings.values():
        b1, b8 = tokens_per_s(timing)
        assert timing.b1_s > 0 and timing.b8_s is not None and timing.b8_s > 0
        assert b1 == pytest.approx(1 / timing.b1_s) and b8 == pytest.approx(8 / timing.b8_s)


def test_an_artifact_without_its_config_beside_it_is_left_out(artifacts: dict[str, Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(artifacts["int4-b32"], bare / "model.onnx")  # the graph alone: no genai_config.json
    timings = DecodeTimer(EngineSettings(), QUICK).time({"fp32": artifacts["fp32"], "int4-b32": bare / "model.onnx"})
    assert set(timings) == {"fp32"}


def test_without_fp32_there_is_nothing_to_compare_with(artifacts: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="FP32"):
        DecodeTimer(EngineSettings(), QUICK).time({"int4-b32": artifacts["int4-b32"]})


def test_the_choice_names_each_artifacts_decode_tokens_per_s(artifacts: dict[str, Path], tmp_path: Path) -> None:
    timer = ArtifactTimer(SessionFactory(tmp_path / "ort-cache", ["CPUExecutionProvider"]), "cls", "edge-a", QUICK)
    choice = timer.choose_decoder(artifacts)
    assert choice.artifact in artifacts and (choice.source, choice.from_node) == ("measured", "edge-a")
    assert choice.reason.startswith("fastest decode of 2 on this node (tokens/s b1/b8: ")
    assert "fp32 " in choice.reason and "int4-b32 " in choice.reason
    if choice.artifact == "fp32":  # never a candidate that is not faster than FP32 by the margin
        assert (choice.speedup_b1, choice.speedup_b8) == (1.0, 1.0)
    else:
        assert min(choice.speedup_b1 or 0, choice.speedup_b8 or 0) >= QUICK.min_speedup
