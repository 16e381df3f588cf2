"""One form for the edge's write errors (a full disk above all): the cache and the
version files both raise an ``OSError`` subclass whose message says what could not be
written and where, with ``ENOSPC`` for a full disk whichever layer noticed it."""

from __future__ import annotations

import errno
import sqlite3
from typing import TypeVar

E = TypeVar("E", bound=OSError)


def write_error(cls: type[E], exc: BaseException, message: str) -> E:
    """``exc`` (an OSError or a SQLite error) as ``cls``: "no space left on device: {message}"
    for a full disk or quota, else "{reason}: {message}" with ``exc``'s errno (EIO if none)."""
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    full = full or getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    if full:
        return cls(errno.ENOSPC, f"no space left on device: {message}")
    code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return cls(code, f"{reason}: {message}")
