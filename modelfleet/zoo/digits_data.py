"""scikit-learn's bundled digits, shaped for the zoo's CNN and transformer.

Training (``scripts/train_zoo.py``, with torch) and the run-time builders (without it)
both take their data from here, so the held-out split the accuracy is measured on is
the one the weights never saw. The split is the digits MLP's: stratified, 25 % held out,
``random_state=0``.

- Images: the 8x8 pixels (0..16) scaled to [0, 1] and upscaled by 4 to ``[1, 32, 32]``.
- Tokens: each image as the sequence of its *lit* pixels in reading order, one token per
  pixel for its (position, brightness level), after a ``[CLS]`` token. A digit lights 16
  to 42 of its 64 pixels, so sequences really vary in length (17 to 43 tokens), and a
  batch is padded with ``[PAD]`` and masked as a tokenizer would do it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelfleet.extras import require_extra

PAD_ID = 0
CLS_ID = 1
#: Pixel values 1..16 folded into this many brightness levels per position.
LEVELS = 4
PIXELS = 64
VOCAB = 2 + PIXELS * LEVELS
#: ``[CLS]`` plus every pixel lit.
MAX_TOKENS = 1 + PIXELS
UPSCALE = 4
#: Calibration samples taken from the training split (seeded choice).
CALIBRATION_SAMPLES = 256
CALIBRATION_SEED = 7


@dataclass(frozen=True, eq=False)
class DigitsSplit:
    """Raw pixels (uint8, 0..16, ``[n, 64]``) and labels (int64) of each part."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def digits_split() -> DigitsSplit:
    """The fixed split (needs scikit-learn, for its bundled data set)."""
    require_extra("demo", "the digits data set", ("sklearn",))
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    parts = train_test_split(x.astype(np.uint8), y.astype(np.int64), test_size=0.25, random_state=0, stratify=y)
    train_x, test_x, train_y, test_y = parts
    return DigitsSplit(train_x, train_y, test_x, test_y)


def digit_images(pixels: np.ndarray) -> np.ndarray:
    """float32 ``[n, 1, 32, 32]`` in [0, 1] (nearest-neighbour upscaling: exact and cheap)."""
    images = (pixels.reshape(-1, 1, 8, 8).astype(np.float32) / np.float32(16.0)).astype(np.float32)
    return np.repeat(np.repeat(images, UPSCALE, axis=2), UPSCALE, axis=3)


def digit_sequence(pixels: np.ndarray) -> np.ndarray:
    """One image's token ids: ``[CLS]`` then one token per lit pixel, in reading order."""
    flat = pixels.reshape(PIXELS).astype(np.int64)
    (lit,) = np.nonzero(flat)
    levels = (flat[lit] - 1) * LEVELS // 16  # 1..16 → 0..LEVELS-1
    return np.concatenate([[CLS_ID], 2 + lit * LEVELS + levels]).astype(np.int64)


def pad_sequences(sequences: list[np.ndarray], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``attention_mask``, int64 ``[n, length]`` (the longest by default)."""
    width = max(len(s) for s in sequences) if length is None else length
    ids = np.full((len(sequences), width), PAD_ID, np.int64)
    mask = np.zeros((len(sequences), width), np.int64)
    for row, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"a sequence of {len(seq)} tokens does not fit in {width}")
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def digit_tokens(pixels: np.ndarray, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The padded token batch of many images."""
    return pad_sequences([digit_sequence(p) for p in pixels], length)


def calibration_rows(split: DigitsSplit) -> np.ndarray:
    """The indices into the training split that calibration files hold."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    return np.sort(rng.choice(len(split.train_x), CALIBRATION_SAMPLES, replace=False))
