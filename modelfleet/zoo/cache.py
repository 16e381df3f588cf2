"""An on-disk cache for zoo models, so tests and benchmarks build each recipe once.

Entries are directories keyed by a name and a build-version string: a recipe that
changes its version string gets a fresh entry instead of silently reusing stale
files. An entry appears with one ``rename`` of a fully written temporary
directory, so a crashed or concurrent build never leaves a half-written entry
that a later run would trust."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

#: Environment variable that moves the cache (CI, tests, read-only home directories).
CACHE_ENV = "MODELFLEET_ZOO_CACHE"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def zoo_cache_dir() -> Path:
    """``$MODELFLEET_ZOO_CACHE`` or ``~/.cache/modelfleet/zoo``; not created here."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "modelfleet" / "zoo"


def entry_key(name: str, version: str) -> str:
    """A path-safe directory name for ``name`` at ``version`` (unsafe runs become ``_``)."""
    return f"{_UNSAFE.sub('_', name)}--{_UNSAFE.sub('_', version)}"


def cached_entry(
    name: str,
    version: str,
    build: Callable[[Path], None],
    cache_dir: Path | None = None,
) -> Path:
    """The entry for ``name``/``version``; ``build(tmp_dir)`` fills a fresh one if absent.

    The directory gets its final name only once ``build`` returns; if two processes
    race, the first rename wins and the loser's copy is discarded."""
    root = cache_dir if cache_dir is not None else zoo_cache_dir()
    final = root / entry_key(name, version)
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
