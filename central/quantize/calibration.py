"""Calibration data: load and check the operator's ``.npz``, split it, or make some up.

The file is untrusted input, so every problem becomes a ``BadRequest`` that names the
array and what was expected, and it is read with ``allow_pickle=False``. Arrays that
match no model input are ignored (and reported), so a file that also carries labels
still works. The split is a seeded permutation, not the file order, so a file sorted
by class still gives a representative held-out part: ``HELD_OUT_FRACTION`` (at least
``MIN_HELD_OUT`` samples, more up to half the file when the guard's bound needs them) is
held out for the accuracy guard and never calibrates.
Inputs made up when there is no file live in ``central.quantize.synthetic``."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from central.errors import BadRequest
from fleetwire.manifest import TensorSpec

Samples = dict[str, np.ndarray]

MIN_CALIBRATION = 10
MIN_HELD_OUT = 10
#: Fewer samples than this cannot give both parts their minimum.
MIN_SAMPLES = MIN_CALIBRATION + MIN_HELD_OUT
HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 0
DEFAULT_BATCH = 32


@dataclass(frozen=True, eq=False)
class CalibrationData:
    """A checked calibration file: arrays cast to the inputs' dtypes, by input name."""

    arrays: Samples
    samples: int
    ignored: list[str] = field(default_factory=list)


def _check_array(spec: TensorSpec, array: np.ndarray, what: str) -> np.ndarray:
    """The array cast to the input's dtype, or ``BadRequest`` saying what is wrong."""
    target = np.dtype(spec.dtype)
    if not np.can_cast(array.dtype, target, casting="same_kind"):
        raise BadRequest(f"{what} array {spec.name!r} has dtype {array.dtype}, not castable to {target}")
    expected = ["N" if d < 0 else d for d in spec.shape]
    if array.ndim != len(spec.shape) or array.ndim == 0:
        raise BadRequest(f"{what} array {spec.name!r} has shape {list(array.shape)}, expected {expected}")
    for got, want in zip(array.shape[1:], spec.shape[1:], strict=True):
        if want >= 0 and got != want:
            raise BadRequest(f"{what} array {spec.name!r} has shape {list(array.shape)}, expected {expected}")
    return array.astype(target, copy=False)


def read_npz(path: Path, what: str = "calibration") -> dict[str, np.ndarray]:
    """Every array of the file; anything that is not a plain npz is a ``BadRequest``.

    The file is opened here, not by ``np.load``, which leaks its handle when the zip
    directory is corrupt."""
    try:
        with path.open("rb") as handle:
            loaded = np.load(handle, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise BadRequest(f"{what} file is a single .npy array, not an .npz archive")
            with loaded as npz:
                return {name: npz[name] for name in npz.files}
    except BadRequest:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BadRequest(f"{what} file is not a readable .npz archive: {exc}") from exc


def input_arrays(raw: dict[str, np.ndarray], inputs: list[TensorSpec], what: str) -> tuple[Samples, int]:
    """(arrays by input name, cast and checked; sample count): ``BadRequest`` on the first problem."""
    missing = [spec.name for spec in inputs if spec.name not in raw]
    if missing:
        raise BadRequest(f"{what} file lacks arrays for inputs {missing} (it has {sorted(raw)})")
    arrays = {spec.name: _check_array(spec, raw[spec.name], what) for spec in inputs}
    counts = {name: int(a.shape[0]) for name, a in arrays.items()}
    if len(set(counts.values())) > 1:
        raise BadRequest(f"{what} arrays disagree on the number of samples: {counts}")
    return arrays, next(iter(counts.values()), 0)


def load_calibration(path: Path, inputs: list[TensorSpec]) -> CalibrationData:
    """Check the file against the model's inputs; ``BadRequest`` on the first problem."""
    raw = read_npz(path)
    arrays, samples = input_arrays(raw, inputs, "calibration")
    if samples < MIN_SAMPLES:
        raise BadRequest(f"calibration file has {samples} samples; at least {MIN_SAMPLES} are needed")
    ignored = sorted(set(raw) - set(arrays))
    return CalibrationData(arrays=arrays, samples=samples, ignored=ignored)


def split(data: CalibrationData, wanted_held_out: int = 0) -> tuple[Samples, Samples]:
    """(calibration part, held-out part) of a seeded permutation of the samples.

    ``wanted_held_out``: hold out that many when the usual fraction is fewer (the guard's
    lower bound needs them to reach its threshold), but never more than half the file."""
    usual = max(MIN_HELD_OUT, round(data.samples * HELD_OUT_FRACTION))
    held = max(usual, min(wanted_held_out, data.samples // 2))
    order = np.random.default_rng(SPLIT_SEED).permutation(data.samples)
    calib_idx, held_idx = np.sort(order[held:]), np.sort(order[:held])
    calib = {name: a[calib_idx] for name, a in data.arrays.items()}
    held_out = {name: a[held_idx] for name, a in data.arrays.items()}
    return calib, held_out


def batch_size(inputs: list[TensorSpec], preferred: int = DEFAULT_BATCH) -> int:
    """A model with a fixed batch dimension must be fed exactly that many samples."""
    fixed = [spec.shape[0] for spec in inputs if spec.shape and spec.shape[0] > 0]
    return min(fixed) if fixed else preferred


def sample_count(samples: Samples) -> int:
    """Samples per input (all inputs agree; checked when loading)."""
    return int(next(iter(samples.values())).shape[0]) if samples else 0


def batches(samples: Samples, size: int, *, drop_partial: bool = False) -> Iterator[Samples]:
    """Consecutive batches of ``size``; the last may be smaller unless ``drop_partial``
    (a model with a fixed batch dimension cannot take a smaller one)."""
    total = sample_count(samples)
    for start in range(0, total, size):
        if drop_partial and start + size > total:
            return
        yield {name: a[start : start + size] for name, a in samples.items()}


class SamplesReader(CalibrationDataReader):
    """Feeds ``quantize_static`` the calibration part in batches.

    With a fixed batch dimension a trailing partial batch would not fit the model, so
    it is dropped; with a variable one it is kept (MinMax calibration copes)."""

    def __init__(self, samples: Samples, size: int, *, fixed_batch: bool = False) -> None:
        self._batches = list(batches(samples, size, drop_partial=fixed_batch))
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch, or ``None`` when done (the protocol ORT expects)."""
        if self._next >= len(self._batches):
            return None
        self._next += 1
        return self._batches[self._next - 1]

    def __len__(self) -> int:
        return len(self._batches)

    def rewind(self) -> None:
        """Start again from the first batch (for a retry with other settings)."""
        self._next = 0
