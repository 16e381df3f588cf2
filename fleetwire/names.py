"""Model names and version labels become directory names on every edge, so they are
restricted to a portable, path-safe alphabet."""

from __future__ import annotations

import re

#: Letters, digits, ``.``, ``_`` and ``-``; starts with a letter or digit; 1 to 128 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)


class InvalidName(ValueError):
    """A model name or version label that cannot be used."""


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid model name or version label, else raise.

    ``kind`` ("model name", "version") only makes the message precise.
    """
    if not value:
        raise InvalidName(f"{kind} must not be empty")
    if len(value) > 128:
        raise InvalidName(f"{kind} is {len(value)} characters long; the limit is 128")
    if "/" in value or "\\" in value:
        raise InvalidName(f"{kind} {value!r} must not contain a path separator")
    if ".." in value:
        raise InvalidName(f"{kind} {value!r} must not contain '..'")
    if not _NAME_RE.match(value):
        raise InvalidName(
            f"{kind} {value!r} may only use letters, digits, '.', '_' and '-', and must start with a letter or digit"
        )
    return value
