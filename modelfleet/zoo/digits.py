"""A real, small classifier: scikit-learn's 8x8 digits, an MLP, exported to ONNX.

Synthetic MLPs have random logits whose top-2 margins are tiny, so they say little
about whether INT8 keeps a model's *decisions*. This one is trained on real data
(97 % test accuracy), which is what the accuracy guard and the quantization bench
need. Everything is seeded and the split is fixed, so a rebuild on the same machine
gives the same bytes; the result is cached (see ``modelfleet.zoo.cache``)."""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnxruntime as ort

from modelfleet.extras import DIGITS_TRAINING, require_extra
from modelfleet.zoo.cache import cached_entry, write_atomic

#: Bump when the recipe below changes; library versions are added to the key too.
RECIPE_VERSION = "2"
INPUT_NAME = "input"
ONNX_OPSET = {"": 17, "ai.onnx.ml": 3}
MIN_ACCURACY = 0.95


@dataclass(frozen=True, eq=False)
class DigitsModel:
    """The cached digits classifier and the data to calibrate and evaluate it."""

    onnx_path: Path
    #: ``.npz`` with one float32 array named ``input_name``: the whole TRAIN split.
    calibration_path: Path
    test_x: np.ndarray
    test_y: np.ndarray
    input_name: str
    #: Measured with onnxruntime (CPU) on the test split, not with scikit-learn.
    fp32_test_accuracy: float


def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified 75/25 split, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    parts = train_test_split(x, y.astype(np.int64), test_size=0.25, random_state=0, stratify=y)
    x_train, x_test, y_train, y_test = parts
    return x_train, x_test, y_train, y_test


def _train_and_export(x_train: np.ndarray, y_train: np.ndarray) -> bytes:
    """Fit the MLP and convert it with plain tensor outputs (``label``, ``probabilities``)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(128, 64), random_state=0, max_iter=500)
    with warnings.catch_warnings():
        # Not converging is caught by the accuracy check below, with a clearer message.
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train, y_train)
    model = convert_sklearn(
        clf,
        initial_types=[(INPUT_NAME, FloatTensorType([None, x_train.shape[1]]))],
        options={id(clf): {"zipmap": False}},
        target_opset=ONNX_OPSET,
    )
    model.graph.name = "digits_mlp"  # skl2onnx names graphs with a random uuid; keep bytes stable
    return bytes(model.SerializeToString())


def onnx_accuracy(onnx_path: Path, x: np.ndarray, y: np.ndarray, input_name: str = INPUT_NAME) -> float:
    """Top-1 accuracy of the ``label`` output, run by onnxruntime on the CPU."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (labels,) = session.run(["label"], {input_name: x})
    return float(np.mean(np.asarray(labels) == y))


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _build(directory: Path) -> None:
    """Write model.onnx, calibration.npz, test.npz and meta.json into ``directory``."""
    x_train, x_test, y_train, y_test = _split()
    write_atomic(directory / "model.onnx", _train_and_export(x_train, y_train))
    accuracy = onnx_accuracy(directory / "model.onnx", x_test, y_test)
    if accuracy < MIN_ACCURACY:
        raise RuntimeError(f"digits MLP reached {accuracy:.1%} test accuracy, below {MIN_ACCURACY:.0%}")
    write_atomic(directory / "calibration.npz", _npz_bytes(**{INPUT_NAME: x_train}))
    write_atomic(directory / "test.npz", _npz_bytes(x=x_test, y=y_test))
    meta = {"fp32_test_accuracy": accuracy, "input_name": INPUT_NAME}
    write_atomic(directory / "meta.json", json.dumps(meta).encode())


def _version() -> str:
    """Recipe version plus the libraries whose output it depends on.

    Read from the installed distributions' metadata, not by importing them: importing
    skl2onnx (and scikit-learn with it) takes seconds, and a cache hit needs neither."""
    return f"{RECIPE_VERSION}-sklearn{version('scikit-learn')}-skl2onnx{version('skl2onnx')}"


def build_digits(cache_dir: Path | None = None) -> DigitsModel:
    """The digits classifier, built on first use and read from the cache afterwards.

    Building it (and the cache key) needs scikit-learn and skl2onnx: the demo extra."""
    require_extra("demo", "the digits model", DIGITS_TRAINING)
    entry = cached_entry("digits-mlp", _version(), _build, cache_dir)
    meta = json.loads((entry / "meta.json").read_text())
    with np.load(entry / "test.npz") as test:
        test_x, test_y = test["x"].astype(np.float32), test["y"].astype(np.int64)
    return DigitsModel(
        onnx_path=entry / "model.onnx",
        calibration_path=entry / "calibration.npz",
        test_x=test_x,
        test_y=test_y,
        input_name=str(meta["input_name"]),
        fp32_test_accuracy=float(meta["fp32_test_accuracy"]),
    )
