"""Real text that ships with every machine: the Python standard library's own source.

The zoo's language model and its tokenizer learn from the top-level ``*.py`` files of the
standard library, taken in sorted order; about one file in ten, picked by a hash of its name
(so the same files whatever else the library holds), is held out for judging: never trained
on, it becomes the model's ``eval.txt``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: One file in this many is held out.
HELD_OUT_EVERY = 10
#: Files larger than this are skipped (a few generated tables would dominate the text).
MAX_FILE_BYTES = 200_000


def stdlib_dir() -> Path:
    """The standard library of the Python running this."""
    return Path(os.__file__).resolve().parent


def is_held_out(path: Path) -> bool:
    """Whether ``path`` belongs to the held-out split (decided by its name alone)."""
    return hashlib.sha256(path.name.encode()).digest()[0] % HELD_OUT_EVERY == 0


def source_files(root: Path | None = None) -> list[Path]:
    """The corpus: the library's top-level ``*.py`` files under ``MAX_FILE_BYTES``, sorted by name."""
    root = root or stdlib_dir()
    return sorted(p for p in root.glob("*.py") if p.is_file() and p.stat().st_size <= MAX_FILE_BYTES)


def split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files)."""
    return [p for p in files if not is_held_out(p)], [p for p in files if is_held_out(p)]


def read_text(path: Path) -> str:
    """A source file's text (a stray byte that is not UTF-8 is replaced)."""
    return path.read_text(encoding="utf-8", errors="replace")
