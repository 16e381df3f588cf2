"""The by-hand INT8 recipe bench runs on the zoo's models: every recipe central makes, and the comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.int8_recipes import main

CNN_ARTIFACTS = ["fp32", "int8-u8s8-qdq", "int8-s8s8-qdq", "int8-u8s8-qop", "int8-dynamic"]
TRANSFORMER_ARTIFACTS = ["fp32", "int8-dynamic", "int8-dynamic-unfused", "fp32-fused"]


def test_every_recipe_of_a_zoo_cnn_and_transformer_is_made_and_compared(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path_factory.getbasetemp() / "zoo-cache"  # shared with the zoo's tests
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    argv = ["--models", "resnet-digits,transformer-digits", "--iters", "1", "--repeats", "1", "--threads", "1"]
    assert main([*argv, "--model-cache", str(cache), "--json", str(tmp_path / "r.json")]) == 0
    assert "central serves an edge of unknown hardware here" in capsys.readouterr().out
    assert list((tmp_path / "cwd").iterdir()) == []  # ORT's leftovers stay in the bench's work dir
    models = {m["name"]: m for m in json.loads((tmp_path / "r.json").read_text())["models"]}
    assert list(models["resnet-digits"]["artifacts"]) == CNN_ARTIFACTS
    assert list(models["transformer-digits"]["artifacts"]) == TRANSFORMER_ARTIFACTS
    for model in models.values():
        assert model["central_serves"] in model["artifacts"]
        for row in model["artifacts"].values():
            # Trained models on their own eval data: every INT8 form keeps the scores' direction.
            assert row["cosine_b1"] > 0.99 and row["cosine_b8"] > 0.99 and row["ms_b8"] > 0
            assert 0 < row["size_ratio"] <= 1.0


def test_a_model_that_is_not_a_zoo_cnn_or_transformer_is_refused() -> None:
    with pytest.raises(SystemExit, match="not a zoo CNN or transformer: mlp-digits; known: resnet-digits"):
        main(["--models", "mlp-digits"])
