"""The trained weights committed under ``modelfleet/zoo/weights/``, one ``.npz`` per model.

Each file holds the weights in the layout the graph builders take (the names and shapes
of ``resnet_shapes`` / ``transformer_shapes``), plus two text entries: the architecture's
configuration, so a file is never built into a graph it was not trained for, and what
training measured (accuracy, torch version, seed), for the record. ``scripts/train_zoo.py``
writes them; loading needs numpy only."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
_CONFIG_KEY = "__config__"
_META_KEY = "__meta__"


@dataclass(frozen=True, eq=False)
class TrainedWeights:
    """One committed weights file, read."""

    arrays: dict[str, np.ndarray]
    #: The architecture's configuration as JSON (``ResNetConfig.to_json`` and the like).
    config_json: str
    #: What the training script recorded (``test_accuracy``, ``torch``, ``seed``, ...).
    meta: dict[str, Any]
    #: The first 16 hex digits of the file's sha256: part of the cache key of the models built from it.
    digest: str


def weights_path(name: str) -> Path:
    """Where the weights of ``name`` are committed."""
    return WEIGHTS_DIR / f"{name}.npz"


def save_weights(path: Path, arrays: dict[str, np.ndarray], config_json: str, meta: dict[str, Any]) -> None:
    """Write a compressed ``.npz`` (float32 arrays; the two text entries as unicode scalars)."""
    reserved = {_CONFIG_KEY, _META_KEY} & arrays.keys()
    if reserved:
        raise ValueError(f"weight names {sorted(reserved)} are reserved")
    entries: dict[str, np.ndarray] = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    entries[_CONFIG_KEY] = np.array(config_json)
    entries[_META_KEY] = np.array(json.dumps(meta, sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **entries)  # type: ignore[arg-type]


def load_weights(path: Path) -> TrainedWeights:
    """Read a file written by ``save_weights`` (no pickles: plain arrays only)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k not in (_CONFIG_KEY, _META_KEY)}
        config_json = str(data[_CONFIG_KEY])
        meta = json.loads(str(data[_META_KEY]))
    return TrainedWeights(arrays, config_json, meta, digest)
