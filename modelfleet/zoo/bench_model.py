"""The quantization benchmark's model: a large FP32 MLP plus seeded calibration data.

At the default size (width 2048, 7 hidden layers) the weights are about 117 MB, big
enough that FP32 inference is bound by memory traffic the way real edge models are,
which is where INT8's 4x smaller weights pay off. Built with ``build_mlp`` and cached,
so the benchmark does not pay the build on every run."""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from modelfleet.zoo.cache import cached_entry, write_atomic
from modelfleet.zoo.synthetic import build_mlp

#: Bump when the recipe changes (the sizes are part of the key already).
RECIPE_VERSION = "1"
CALIBRATION_SAMPLES = 256
CALIBRATION_SEED = 1234


@dataclass(frozen=True)
class BenchModel:
    """A cached benchmark MLP and its calibration file."""

    onnx_path: Path
    #: ``.npz`` with ``input``: float32 ``[256, width]``, standard normal, seeded.
    calibration_path: Path
    input_name: str
    width: int


def _build(directory: Path, *, width: int, hidden_layers: int) -> None:
    """Write model.onnx and calibration.npz into ``directory``."""
    build_mlp(directory / "model.onnx", width=width, hidden_layers=hidden_layers)
    rng = np.random.default_rng(CALIBRATION_SEED)
    samples = rng.standard_normal((CALIBRATION_SAMPLES, width), dtype=np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, input=samples)
    write_atomic(directory / "calibration.npz", buffer.getvalue())


def build_bench_model(cache_dir: Path | None = None, *, width: int = 2048, hidden_layers: int = 7) -> BenchModel:
    """The benchmark MLP of the given size, built on first use."""
    version = f"{RECIPE_VERSION}-w{width}-l{hidden_layers}"
    build = partial(_build, width=width, hidden_layers=hidden_layers)
    entry = cached_entry("bench-mlp", version, build, cache_dir)
    return BenchModel(
        onnx_path=entry / "model.onnx",
        calibration_path=entry / "calibration.npz",
        input_name="input",
        width=width,
    )
