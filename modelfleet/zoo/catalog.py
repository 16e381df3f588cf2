"""Every zoo model by name: what the benchmarks and ``modelfleet zoo`` iterate over.

An entry says what a model is (family, trained or random) and how to build it; building
returns a ``ZooModel`` with the paths of its files and of its calibration and eval data.
Nothing is built until asked for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelfleet.zoo.artifact import LABEL_KEY, Family, ZooModel, write_npz
from modelfleet.zoo.cache import cached_entry
from modelfleet.zoo.random_models import build_huge_mlp, build_resnet_random, build_transformer_random
from modelfleet.zoo.trained import build_resnet_digits, build_transformer_digits, build_transformer_digits_external


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo, not yet built."""

    name: str
    family: Family
    #: Trained on real data (has eval data and an accuracy) or seeded random weights (speed only).
    trained: bool
    description: str
    #: ``build(cache_dir)`` makes the model on first use (``None``: the default zoo cache) and returns it.
    build: Callable[[Path | None], ZooModel]
    #: Several GiB to build and load: only for a benchmark that asks for it by name.
    huge: bool = False


def build_digits_mlp(cache_dir: Path | None = None) -> ZooModel:
    """The scikit-learn digits MLP (``modelfleet zoo digits``) as a ``ZooModel``, with an eval file."""
    from modelfleet.zoo.digits import build_digits

    digits = build_digits(cache_dir)

    def build(directory: Path) -> None:
        write_npz(directory / "eval.npz", {digits.input_name: digits.test_x, LABEL_KEY: digits.test_y})

    entry = cached_entry("digits-mlp-eval", digits.onnx_path.parent.name, build, cache_dir)
    return ZooModel(
        name="mlp-digits",
        family="mlp",
        onnx_path=digits.onnx_path,
        input_names=(digits.input_name,),
        calibration_path=digits.calibration_path,
        eval_path=entry / "eval.npz",
        fp32_accuracy=digits.fp32_test_accuracy,
    )


_ENTRIES = (
    ZooEntry("mlp-digits", "mlp", True, "scikit-learn MLP on the digits data set (8x8 inputs)", build_digits_mlp),
    ZooEntry(
        "resnet-digits",
        "cnn",
        True,
        "ResNet-style CNN (3 stages of basic blocks, BatchNorm) trained on digits upscaled to 1x32x32",
        build_resnet_digits,
    ),
    ZooEntry("resnet18-224", "cnn", False, "ResNet-18's shape at 3x224x224, 1000 classes, 47 MB", build_resnet_random),
    ZooEntry(
        "transformer-digits",
        "transformer",
        True,
        "BERT-style encoder classifier (2 layers, d=64) trained on digits as token sequences",
        build_transformer_digits,
    ),
    ZooEntry(
        "transformer-minilm",
        "transformer",
        False,
        "MiniLM-L6-H384's shape (6 layers, d=384, 30522-token vocabulary), 91 MB",
        build_transformer_random,
    ),
    ZooEntry(
        "transformer-digits-external",
        "transformer",
        True,
        "transformer-digits shipped as model.onnx + model.onnx.data (ONNX external data)",
        build_transformer_digits_external,
    ),
    ZooEntry("mlp-huge", "mlp", False, "MLP of 2.25 GiB as ONNX external data", build_huge_mlp, huge=True),
)


def zoo_models(*, include_huge: bool = False) -> list[ZooEntry]:
    """Every zoo model, in a stable order; the multi-GiB one only when asked for."""
    return [e for e in _ENTRIES if include_huge or not e.huge]


def zoo_entry(name: str) -> ZooEntry:
    """The entry called ``name`` (``KeyError`` naming the known ones otherwise)."""
    for entry in _ENTRIES:
        if entry.name == name:
            return entry
    raise KeyError(f"no zoo model {name!r}; known: {', '.join(e.name for e in _ENTRIES)}")
