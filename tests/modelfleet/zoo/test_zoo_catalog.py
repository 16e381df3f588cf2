"""``zoo_models``: the list the benchmarks iterate over."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelfleet.zoo import build_digits_mlp, eval_accuracy, zoo_entry, zoo_models


def test_every_family_has_a_trained_and_a_random_model() -> None:
    entries = zoo_models()
    assert len({e.name for e in entries}) == len(entries)
    kinds = {(e.family, e.trained) for e in entries}
    assert {("cnn", True), ("cnn", False), ("transformer", True), ("transformer", False), ("mlp", True)} <= kinds
    assert not any(e.huge for e in entries)
    (huge,) = [e for e in zoo_models(include_huge=True) if e.huge]
    assert huge.name == "mlp-huge" and not huge.trained


def test_entries_build_to_models_with_their_data(zoo_cache: Path) -> None:
    entry = zoo_entry("resnet-digits")
    model = entry.build(zoo_cache)
    assert (model.name, model.family) == (entry.name, entry.family)
    assert model.onnx_path.is_file() and model.eval_path is not None and model.calibration_path is not None


def test_the_digits_mlp_has_an_eval_file_with_labels(zoo_cache: Path) -> None:
    model = build_digits_mlp(zoo_cache)
    assert model.eval_path is not None
    with np.load(model.eval_path) as data:
        assert sorted(data.files) == ["input", "label"]
    assert eval_accuracy(model) == model.fp32_accuracy


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="transformer-digits"):
        zoo_entry("resnet-50")
