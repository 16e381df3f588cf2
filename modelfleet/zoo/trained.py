"""The zoo's trained models: committed weights → ONNX graph → cached files, without torch.

Each build reads ``modelfleet/zoo/weights/<name>.npz`` (written by
``scripts/train_zoo.py``), builds the graph with the same numpy builder training used,
writes calibration samples from the training split and an eval file from the held-out
split, and measures the model's accuracy on it with ONNX Runtime. A model that misses
its floor fails the build loudly rather than entering the cache. The cache key holds the
weights file's digest: retrained weights get a fresh entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from modelfleet.zoo import digits_data
from modelfleet.zoo.artifact import LABEL_KEY, Family, ZooModel, eval_accuracy, read_meta, write_meta, write_npz
from modelfleet.zoo.cache import cached_entry, write_atomic
from modelfleet.zoo.external import DATA_FILE, MODEL_FILE, save_with_external_data
from modelfleet.zoo.resnet import INPUT_NAME, ResNetConfig, resnet_graph
from modelfleet.zoo.transformer import INPUT_NAMES, TransformerConfig, transformer_graph
from modelfleet.zoo.weights import TrainedWeights, load_weights, weights_path

#: Bump when what a build writes changes (the weights' digest is in the key already).
RECIPE_VERSION = "1"
RESNET_MIN_ACCURACY = 0.97
TRANSFORMER_MIN_ACCURACY = 0.95


def _resnet(weights: TrainedWeights) -> onnx.ModelProto:
    return resnet_graph(ResNetConfig.from_json(weights.config_json), weights.arrays, name="resnet_digits")


def _transformer(weights: TrainedWeights) -> onnx.ModelProto:
    return transformer_graph(
        TransformerConfig.from_json(weights.config_json), weights.arrays, name="transformer_digits"
    )


def _resnet_inputs(pixels: np.ndarray) -> dict[str, np.ndarray]:
    return {INPUT_NAME: digits_data.digit_images(pixels)}


def _transformer_inputs(pixels: np.ndarray) -> dict[str, np.ndarray]:
    ids, mask = digits_data.digit_tokens(pixels)
    return dict(zip(INPUT_NAMES, (ids, mask), strict=True))


_Graph = Callable[[TrainedWeights], onnx.ModelProto]
_Inputs = Callable[[np.ndarray], dict[str, np.ndarray]]


def _build_trained(
    name: str,
    family: Family,
    weights_file: str,
    graph: _Graph,
    inputs: _Inputs,
    min_accuracy: float,
    cache_dir: Path | None,
    *,
    external: bool = False,
) -> ZooModel:
    """The cached model ``name`` built from ``weights_file``; the data files come from the digits split."""
    weights = load_weights(weights_path(weights_file))
    input_names = tuple(inputs(np.zeros((1, digits_data.PIXELS), np.uint8)))

    def located(directory: Path) -> ZooModel:
        return ZooModel(
            name=name,
            family=family,
            onnx_path=directory / MODEL_FILE,
            input_names=input_names,
            data_files=(directory / DATA_FILE,) if external else (),
            calibration_path=directory / "calibration.npz",
            eval_path=directory / "eval.npz",
        )

    def build(directory: Path) -> None:
        split = digits_data.digits_split()
        model = graph(weights)
        if external:
            save_with_external_data(model, directory)
        else:
            write_atomic(directory / MODEL_FILE, model.SerializeToString())
        write_npz(directory / "calibration.npz", inputs(split.train_x[digits_data.calibration_rows(split)]))
        write_npz(directory / "eval.npz", inputs(split.test_x) | {LABEL_KEY: split.test_y})
        accuracy = eval_accuracy(located(directory))
        if accuracy < min_accuracy:
            raise RuntimeError(f"{name} reached {accuracy:.1%} on the held-out split, below {min_accuracy:.0%}")
        write_meta(directory, {"fp32_accuracy": accuracy, "weights_digest": weights.digest})

    entry = cached_entry(name, f"{RECIPE_VERSION}-{weights.digest}", build, cache_dir)
    return replace(located(entry), fp32_accuracy=float(read_meta(entry)["fp32_accuracy"]))


def build_resnet_digits(cache_dir: Path | None = None) -> ZooModel:
    """The ResNet-style CNN trained on digits (1x32x32 images), ≥ 97 % on the held-out split."""
    return _build_trained(
        "resnet-digits", "cnn", "resnet_digits", _resnet, _resnet_inputs, RESNET_MIN_ACCURACY, cache_dir
    )


def build_transformer_digits(cache_dir: Path | None = None) -> ZooModel:
    """The encoder classifier trained on digits as token sequences (``digits_data``)."""
    return _build_trained(
        "transformer-digits",
        "transformer",
        "transformer_digits",
        _transformer,
        _transformer_inputs,
        TRANSFORMER_MIN_ACCURACY,
        cache_dir,
    )


def build_transformer_digits_external(cache_dir: Path | None = None) -> ZooModel:
    """The same trained encoder shipped as ``model.onnx`` + ``model.onnx.data``, as exporters write it."""
    return _build_trained(
        "transformer-digits-external",
        "transformer",
        "transformer_digits",
        _transformer,
        _transformer_inputs,
        TRANSFORMER_MIN_ACCURACY,
        cache_dir,
        external=True,
    )
