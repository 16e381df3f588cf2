"""Models made by code, for tests, the demo and benchmarks (never from a hub)."""

from __future__ import annotations

from modelfleet.zoo.artifact import ZooModel, eval_accuracy
from modelfleet.zoo.bench_model import BenchModel, build_bench_model
from modelfleet.zoo.cache import zoo_cache_dir
from modelfleet.zoo.catalog import ZooEntry, build_digits_mlp, zoo_entry, zoo_models
from modelfleet.zoo.digits import DigitsModel, build_digits
from modelfleet.zoo.drift import DRIFT_SHIFT, DriftClassifier, build_drift_classifier, drift_samples
from modelfleet.zoo.random_models import (
    build_huge_mlp,
    build_resnet_random,
    build_transformer_random,
    write_random_resnet,
    write_random_transformer,
)
from modelfleet.zoo.synthetic import build_mlp, mlp_bytes
from modelfleet.zoo.trained import build_resnet_digits, build_transformer_digits, build_transformer_digits_external

__all__ = [
    "DRIFT_SHIFT",
    "BenchModel",
    "DigitsModel",
    "DriftClassifier",
    "ZooEntry",
    "ZooModel",
    "build_bench_model",
    "build_digits",
    "build_digits_mlp",
    "build_drift_classifier",
    "build_huge_mlp",
    "build_mlp",
    "build_resnet_digits",
    "build_resnet_random",
    "build_transformer_digits",
    "build_transformer_digits_external",
    "build_transformer_random",
    "drift_samples",
    "eval_accuracy",
    "mlp_bytes",
    "write_random_resnet",
    "write_random_transformer",
    "zoo_cache_dir",
    "zoo_entry",
    "zoo_models",
]
