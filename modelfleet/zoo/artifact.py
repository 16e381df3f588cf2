"""``ZooModel``: one zoo model built on disk, with the data that goes with it."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from modelfleet.zoo.cache import write_atomic

Family = Literal["cnn", "transformer", "mlp"]
#: The key of the labels in an eval file; the other arrays are named after the model's inputs.
LABEL_KEY = "label"
META_FILE = "meta.json"


@dataclass(frozen=True)
class ZooModel:
    """A built model: its ONNX file, the external-data files next to it, and its data files."""

    name: str
    family: Family
    onnx_path: Path
    input_names: tuple[str, ...]
    #: External-data files the ``.onnx`` refers to (they must stay next to it); empty when self-contained.
    data_files: tuple[Path, ...] = ()
    #: ``.npz`` of input arrays (named as the inputs) for static INT8 calibration.
    calibration_path: Path | None = None
    #: ``.npz`` of held-out inputs plus ``label`` (int64 class ids): for ``--eval``; trained models only.
    eval_path: Path | None = None
    #: Top-1 accuracy on ``eval_path`` measured with ONNX Runtime at build time; ``None`` for random weights.
    fp32_accuracy: float | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        """Everything a push of this model must upload."""
        return (self.onnx_path, *self.data_files)

    @property
    def size_bytes(self) -> int:
        """The model's bytes on disk, external data included."""
        return sum(p.stat().st_size for p in self.files)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` (what ``np.load`` and the quantizer read fastest)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``npz_bytes`` written atomically."""
    write_atomic(path, npz_bytes(arrays))


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    """The facts measured at build time, next to the model."""
    write_atomic(directory / META_FILE, json.dumps(meta, sort_keys=True).encode())


def read_meta(directory: Path) -> dict[str, Any]:
    """What ``write_meta`` wrote."""
    meta: dict[str, Any] = json.loads((directory / META_FILE).read_text())
    return meta


def eval_accuracy(model: ZooModel) -> float:
    """Top-1 accuracy of ``model`` on its eval file, run by ONNX Runtime on the CPU."""
    import onnxruntime as ort

    if model.eval_path is None:
        raise ValueError(f"{model.name} has no eval data (random weights)")
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    with np.load(model.eval_path) as data:
        feeds = {name: data[name] for name in model.input_names}
        labels = data[LABEL_KEY]
    outputs = [o.name for o in session.get_outputs()]
    # Scores when the model gives them (``logits``; scikit-learn's ``probabilities``), else its labels.
    name = next((n for n in ("logits", "probabilities") if n in outputs), outputs[0])
    (result,) = session.run([name], feeds)
    predicted = np.asarray(result)
    if predicted.ndim == 2:
        predicted = predicted.argmax(axis=1)
    return float(np.mean(predicted == labels))
