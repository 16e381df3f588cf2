"""Models made by code, for tests, the demo and benchmarks (never from a hub)."""

from __future__ import annotations

from modelfleet.zoo.bench_model import BenchModel, build_bench_model
from modelfleet.zoo.cache import zoo_cache_dir
from modelfleet.zoo.digits import DigitsModel, build_digits
from modelfleet.zoo.synthetic import build_mlp, mlp_bytes

__all__ = [
    "BenchModel",
    "DigitsModel",
    "build_bench_model",
    "build_digits",
    "build_mlp",
    "mlp_bytes",
    "zoo_cache_dir",
]
