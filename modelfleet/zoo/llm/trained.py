"""The zoo's trained language model, committed under ``zoo/weights/llm/``.

``scripts/train_llm_zoo.py`` (``make zoo-train``) trains it on the Python standard library's
source and exports it with ONNX Runtime GenAI's builder into ``genai/`` (only the files a push
takes); beside that folder, ``eval.txt`` (held-out source it never saw) and ``llm.json`` (how it
was trained and what it scored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelfleet.zoo.llm.shapes import TRAINED_SHAPE

TRAINED_DIR = Path(__file__).resolve().parent.parent / "weights" / "llm"
GENAI_DIR = "genai"
EVAL_FILE = "eval.txt"
META_FILE = "llm.json"

__all__ = [
    "EVAL_FILE",
    "GENAI_DIR",
    "META_FILE",
    "TRAINED_DIR",
    "TRAINED_SHAPE",
    "eval_text",
    "trained_llm",
    "trained_meta",
]


def trained_llm() -> Path:
    """The committed GenAI folder: ``model.onnx`` and its data, ``genai_config.json``, the tokenizer's files."""
    folder = TRAINED_DIR / GENAI_DIR
    if not (folder / "genai_config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no trained model: run `make zoo-train`")
    return folder


def eval_text() -> str:
    """Held-out text for the trained model: standard-library source it was not trained on."""
    return (trained_llm().parent / EVAL_FILE).read_text(encoding="utf-8")


def trained_meta() -> dict[str, Any]:
    """What training recorded: shape, corpus, held-out and unigram perplexity, time, versions."""
    meta: dict[str, Any] = json.loads((trained_llm().parent / META_FILE).read_text(encoding="utf-8"))
    return meta
