"""The files a language model brings beside its graph: what may come, and how large.

A language model is more than its graph: ONNX Runtime GenAI's builder writes
``genai_config.json``, the tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and
``chat_template.jinja`` next to ``model.onnx``; Optimum writes ``config.json``,
``generation_config.json`` and ``special_tokens_map.json``. These *companion* files become
files of every artifact of the version (chunked, signed, distributed, verified and
assembled next to ``model.onnx``, like external data). Only the names below may come, each
under its own size cap; any other file the graph does not reference is still refused with
a 400 that names it, and companions are accepted only when the graph is a decoder
(``central.registry.decoder``)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from central.errors import BadRequest
from fleetwire.manifest import COMPANION_FILES


def is_companion(name: str) -> bool:
    """Whether ``name`` is one of the files a language model may bring beside its graph."""
    return name in COMPANION_FILES


def split_companions(staged: Collection[str], referenced: Collection[str]) -> tuple[list[str], list[str]]:
    """(data files, companion files) of a push's staged files: a name the graph references is
    a data file whatever it is called; an unreferenced allow-listed name is a companion."""
    companions = sorted(n for n in staged if is_companion(n) and n not in referenced)
    return [n for n in staged if n not in companions], companions


def check_sizes(directory: Path, companions: Collection[str]) -> None:
    """400 when a companion file is empty or larger than its cap."""
    for name in companions:
        size = (directory / name).stat().st_size
        cap = COMPANION_FILES[name]
        if size > cap:
            raise BadRequest(f"{name} has {size} bytes; a language model's {name} may have at most {cap}")
        if size == 0:
            raise BadRequest(f"{name} is empty")
