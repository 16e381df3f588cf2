"""Language models made by code, in the layout ONNX Runtime GenAI's model builder writes.

- ``trained_llm()``: a small Llama trained on the Python standard library's source, with its
  byte-level BPE tokenizer and held-out ``eval.txt`` (committed; ``make zoo-train`` remakes it).
- ``write_random_llm(out, shape)``: the same graph at any shape (``SHAPES``: ``tiny`` for tests,
  ``200m`` for speed) with seeded random weights and the trained model's tokenizer, in seconds.

Neither needs torch: ``write_decoder`` writes the builder's graph from numpy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from modelfleet.zoo.llm.decoder_shape import DecoderShape, Weights
from modelfleet.zoo.llm.genai_folder import write_decoder
from modelfleet.zoo.llm.shapes import SHAPES, TRAINED_SHAPE
from modelfleet.zoo.llm.trained import TRAINED_DIR, eval_text, trained_llm, trained_meta

__all__ = [
    "SHAPES",
    "TRAINED_DIR",
    "TRAINED_SHAPE",
    "DecoderShape",
    "Weights",
    "eval_text",
    "trained_llm",
    "trained_meta",
    "write_decoder",
    "write_random_llm",
]


def write_random_llm(
    out: Path, shape: DecoderShape | str, seed: int = 0, layer_seeds: Mapping[int, int] | None = None
) -> Path:
    """A GenAI folder at ``shape`` (a ``DecoderShape`` or a name in ``SHAPES``) with random weights
    drawn from ``seed`` and the trained model's tokenizer, written into ``out``; returns ``out``.

    ``layer_seeds`` (layer index → seed) redraws those layers only: ``{3: 1, 9: 1}`` is a
    "fine-tune" of the ``seed`` model that changed layers 3 and 9 and no other byte range."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
        shape = SHAPES[shape]
    return write_decoder(out, shape, trained_llm(), seed=seed, layer_seeds=layer_seeds)
