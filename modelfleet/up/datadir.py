"""The fleet's own directory (default ``.modelfleet/``): central's registry, each edge's
data and chunk cache, the broker's config and every log. Kept between runs, so the next
``up`` starts warm; locked while a fleet runs on it, since two centrals on one SQLite
registry would not end well."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import IO

from modelfleet.up.errors import UpError

__all__ = ["DataDir"]


class DataDir:
    """The directory, held under an exclusive lock inside ``with``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.logs = self.root / "logs"
        self._lock: IO[str] | None = None

    def __enter__(self) -> DataDir:
        self.root.mkdir(parents=True, exist_ok=True)
        # Nothing in here belongs in git; like .venv, the directory says so itself.
        gitignore = self.root / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("# made by modelfleet up\n*\n")
        lock = (self.root / "up.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            lock.close()
            raise UpError(
                f"another modelfleet up (pid {holder}) is running on {self.root}; stop it or pass --data-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock = lock
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._lock is not None:
            self._lock.close()  # closing releases the lock
            self._lock = None
