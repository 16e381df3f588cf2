"""The zoo's speed models: real architectures at real sizes with seeded random weights.

Built at run time and cached, never committed: ResNet-18's shape at 3x224x224 (47 MB),
MiniLM-L6's shape (91 MB) and, for pushing and serving big models, an MLP over 2 GiB
stored as external data. Random weights have no accuracy to keep, so these come with
calibration inputs of the right shapes and ranges but no eval file. Every builder takes
its size as parameters, so tests run the same code at tiny widths: ``write_random_resnet``
and ``write_random_transformer`` write just the graph of any config to a path, uncached,
for tests and benchmarks that need a model of a particular shape."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from modelfleet.zoo.artifact import ZooModel, write_npz
from modelfleet.zoo.cache import cached_entry, write_atomic
from modelfleet.zoo.external import DATA_FILE, MODEL_FILE, write_huge_mlp
from modelfleet.zoo.resnet import INPUT_NAME, RESNET18, ResNetConfig, random_resnet_weights, resnet_graph
from modelfleet.zoo.transformer import (
    INPUT_NAMES,
    MINILM,
    TransformerConfig,
    random_transformer_weights,
    transformer_graph,
)

#: Bump when what a build writes changes (sizes and seeds are in the key already).
RECIPE_VERSION = "2"
CALIBRATION_SEED = 11
#: A push needs 20 samples at least (``central.quantize.calibration.MIN_SAMPLES``): 10 to calibrate,
#: 10 held out for the guard.
RESNET_CALIBRATION_SAMPLES = 32
TRANSFORMER_CALIBRATION_SAMPLES = 64
#: Calibration sequences are 16 to this many tokens long (capped by the model's positions).
TRANSFORMER_CALIBRATION_LENGTH = 128
#: The first ids of a BERT vocabulary are special tokens: [PAD] 0, [CLS] 101 in BERT; here 0 and 1.
PAD_ID, CLS_ID = 0, 1


def _key(config_json: str, seed: int) -> str:
    return f"{RECIPE_VERSION}-{hashlib.sha256(config_json.encode()).hexdigest()[:12]}-s{seed}"


def resnet_calibration(config: ResNetConfig, samples: int = RESNET_CALIBRATION_SAMPLES) -> dict[str, np.ndarray]:
    """Images as a normalised camera pipeline delivers them: about standard normal per channel
    (raw pixels in 0..1 for a model that normalises them itself)."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    size = config.image_size
    shape = (samples, config.in_channels, size, size)
    if config.normalize:
        return {INPUT_NAME: rng.random(shape, dtype=np.float32)}
    return {INPUT_NAME: rng.standard_normal(shape, dtype=np.float32)}


def transformer_calibration(
    config: TransformerConfig, samples: int = TRANSFORMER_CALIBRATION_SAMPLES
) -> dict[str, np.ndarray]:
    """Token batches as a tokenizer pads them: [CLS], ids within the vocabulary, then [PAD] with mask 0."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    longest = min(TRANSFORMER_CALIBRATION_LENGTH, config.max_positions)
    lengths = rng.integers(min(16, longest), longest + 1, samples)
    ids = np.full((samples, longest), PAD_ID, np.int64)
    mask = np.zeros((samples, longest), np.int64)
    for row, length in enumerate(lengths):
        ids[row, 0] = CLS_ID
        ids[row, 1:length] = rng.integers(2, config.vocab, length - 1)
        mask[row, :length] = 1
    return dict(zip(INPUT_NAMES, (ids, mask), strict=True))


def write_random_resnet(path: Path, config: ResNetConfig, seed: int = 0, name: str = "resnet") -> Path:
    """The ResNet of ``config`` with seeded random weights, written (atomically) to ``path``."""
    model = resnet_graph(config, random_resnet_weights(config, seed), name=name.replace("-", "_"))
    write_atomic(path, model.SerializeToString())
    return path


def write_random_transformer(path: Path, config: TransformerConfig, seed: int = 0, name: str = "encoder") -> Path:
    """The encoder classifier of ``config`` with seeded random weights, written (atomically) to ``path``."""
    model = transformer_graph(config, random_transformer_weights(config, seed), name=name.replace("-", "_"))
    write_atomic(path, model.SerializeToString())
    return path


def build_resnet_random(
    cache_dir: Path | None = None, *, config: ResNetConfig = RESNET18, seed: int = 0, name: str = "resnet18-224"
) -> ZooModel:
    """A ResNet of ``config`` (ResNet-18 at 224x224 by default) with seeded random weights."""

    def build(directory: Path) -> None:
        write_random_resnet(directory / MODEL_FILE, config, seed, name)
        write_npz(directory / "calibration.npz", resnet_calibration(config))

    entry = cached_entry(name, _key(config.to_json(), seed), build, cache_dir)
    return ZooModel(name, "cnn", entry / MODEL_FILE, (INPUT_NAME,), calibration_path=entry / "calibration.npz")


def build_transformer_random(
    cache_dir: Path | None = None,
    *,
    config: TransformerConfig = MINILM,
    seed: int = 0,
    name: str = "transformer-minilm",
) -> ZooModel:
    """An encoder classifier of ``config`` (MiniLM-L6-H384's shape by default) with seeded random weights."""

    def build(directory: Path) -> None:
        write_random_transformer(directory / MODEL_FILE, config, seed, name)
        write_npz(directory / "calibration.npz", transformer_calibration(config))

    entry = cached_entry(name, _key(config.to_json(), seed), build, cache_dir)
    return ZooModel(name, "transformer", entry / MODEL_FILE, INPUT_NAMES, calibration_path=entry / "calibration.npz")


def build_huge_mlp(
    cache_dir: Path | None = None, *, width: int = 8192, layers: int = 9, seed: int = 0, name: str = "mlp-huge"
) -> ZooModel:
    """An MLP stored as external data, 2.25 GiB at the defaults (benchmarks only: never in tests at that size)."""

    def build(directory: Path) -> None:
        write_huge_mlp(directory, width=width, layers=layers, seed=seed)
        rng = np.random.default_rng(CALIBRATION_SEED)
        write_npz(directory / "calibration.npz", {"input": rng.standard_normal((16, width), dtype=np.float32)})

    entry = cached_entry(name, f"{RECIPE_VERSION}-w{width}-l{layers}-s{seed}", build, cache_dir)
    return ZooModel(
        name,
        "mlp",
        entry / MODEL_FILE,
        ("input",),
        data_files=(entry / DATA_FILE,),
        calibration_path=entry / "calibration.npz",
    )
