"""The held-out text a language model's candidates are judged on, as token windows.

Where it comes from (the report's ``samples_source``):

* ``eval``: the push's ``--eval`` file, UTF-8 text, all of it held out;
* ``calibration``: the push's ``--calibration`` text, its second half (weight-only
  round-to-nearest calibrates on nothing, so none of it is used for anything else; the
  first half is left for recipes that will);
* ``builtin``: without either, a slice of the Python standard library's own source read
  on central at push time (generic English-and-code text every machine has; a model
  trained on that very source, like the zoo's, has seen it, which a ratio of candidate to
  reference does not mind).

The text is tokenized with the push's own ``tokenizer.json`` and cut into windows of
``window`` tokens (capped by the model's context length), at most ``max_windows``."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from central.errors import BadRequest

#: Standard-library modules the built-in text is read from, in order (plain, stable prose and code).
BUILTIN_MODULES = ("textwrap.py", "fractions.py", "statistics.py", "calendar.py", "difflib.py", "csv.py")
#: Characters of built-in text read at most (well above what 16 windows of 128 tokens need).
_BUILTIN_CHARS = 400_000
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class TextWindows:
    """Token windows of held-out text: ``ids`` is [windows, tokens] int64."""

    ids: np.ndarray
    source: str
    characters: int

    @property
    def predictions(self) -> int:
        """Next-token predictions judged: every position of a window but its last."""
        return int(self.ids.shape[0] * (self.ids.shape[1] - 1))


def _read_text(path: Path, option: str) -> str:
    raw = path.read_bytes()
    if raw.startswith(_ZIP_MAGIC):
        raise BadRequest(f"a language model's {option} is a UTF-8 text file, not an .npz of arrays")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"a language model's {option} must be UTF-8 text: {exc}") from exc


def builtin_text() -> str:
    """A slice of the standard library's source (see the module docstring)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [(stdlib / m).read_text(encoding="utf-8") for m in BUILTIN_MODULES if (stdlib / m).is_file()]
    return "\n".join(parts)[:_BUILTIN_CHARS]


def held_out_text(eval_data: Path | None, calibration: Path | None) -> tuple[str, str]:
    """(text, samples_source) for the guard (see the module docstring)."""
    if eval_data is not None:
        return _read_text(eval_data, "--eval"), "eval"
    if calibration is not None:
        text = _read_text(calibration, "--calibration")
        return text[len(text) // 2 :], "calibration"
    return builtin_text(), "builtin"


def token_windows(tokenizer_path: Path, text: str, source: str, window: int, max_windows: int) -> TextWindows:
    """Tokenize ``text`` and cut it into whole windows; 400 when it gives fewer than two."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    count = min(len(ids) // window, max_windows)
    if count < 2:
        raise BadRequest(
            f"the held-out text ({source}) gives {len(ids)} tokens, fewer than two windows of {window};"
            " send a longer --eval text"
        )
    # Windows spread over the whole text, not only its start.
    starts = np.linspace(0, len(ids) - window, count).astype(np.int64)
    return TextWindows(np.stack([ids[s : s + window] for s in starts]), source, len(text))
