"""Content-addressed chunk cache shared by the node processes of one host.

Layout under ``directory`` (three diskcache databases):

* ``pinned/`` -- chunks some holder pins; eviction policy ``none``.
* ``lru/`` -- every other chunk; policy ``least-recently-used`` so that a
  ``get`` refreshes ``access_time`` (a ``put`` sets it too).
* ``pins/`` -- ``digest -> tuple of holders`` plus ``"holder:<id>" -> tuple
  of digests`` (so one holder's pins are read without a scan).

Why two data caches: a pinned chunk then simply *cannot* be an eviction
candidate, and the pinned volume is an O(1) read of ``pinned/``'s size.
Pinning copies the chunk lru -> pinned, unpinning copies it back (the copy is
written before the original is deleted, so a reader that checks lru, pinned,
lru never misses a chunk in flight).

Why our own eviction instead of diskcache's ``size_limit``: diskcache culls
``cull_limit`` rows at once (10 by default, on every ``set`` once over the
limit) and measures ``volume()`` including SQLite pages, so it cannot
"evict the least recent until just under the limit". Both data caches run
with ``cull_limit=0`` (diskcache never culls) and ``_evict_to_fit`` deletes
the oldest ``lru/`` rows while ``pinned + lru bytes > size_limit``.
``disk_min_file_size=0`` stores every value as a file, which makes diskcache's
``size`` counter exact (inline values count as 0 bytes there).

Concurrency: every change of placement (put, set_pins, eviction) runs inside
``pins.transact()``, a host-wide SQLite write lock, so processes never lose
each other's pins and a chunk pinned while it is being put lands in
``pinned/``. Lock order is always pins -> data cache. A put is atomic because
diskcache writes the value file under a fresh random name first and only
then inserts the row in a transaction: no reader sees a half-written entry.
``get`` opens the file inside diskcache's transaction but reads it outside,
so readers don't hold the lru lock for the whole 1 MiB read.

Crash recovery: a process dying between a data move and the pins commit can
leave a chunk in the wrong cache; ``ChunkStore()`` reconciles on open. Pins of
a holder that never comes back stay until that holder id calls ``set_pins``.

A full disk: a ``put`` whose value file or row cannot be written (``ENOSPC``, or
SQLite's "database or disk is full") raises ``CacheWriteError`` naming the cache
directory, and leaves nothing behind: the partial value file is deleted (diskcache
itself would keep it, unreferenced, for good) and the row was never committed, so
every entry stays readable and passes its digest. A ``get`` whose access-time update
cannot be written raises the same error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import diskcache
from diskcache.core import DBNAME

from edge_node.diskerrors import write_error
from fleetwire.digest import chunk_digest, is_digest

log = logging.getLogger(__name__)

_HOLDER_PREFIX = "holder:"


class CorruptChunk(ValueError):
    """The bytes offered for a digest do not hash to it."""


class CacheWriteError(OSError):
    """The cache could not write (typically a full disk); the message names the directory."""


def _write_error(exc: BaseException, what: str, directory: str) -> CacheWriteError:
    """``exc`` (an OSError or a SQLite error) as a CacheWriteError naming ``directory``."""
    return write_error(CacheWriteError, exc, f"cannot {what} in the cache at {directory}")


class _Disk(diskcache.Disk):
    """diskcache's Disk, except that a value file whose write fails is deleted, and the
    last file this thread stored is remembered (``ChunkStore.put`` deletes it when the
    row that would reference it is not committed)."""

    _last = threading.local()

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple[Any, ...]:
        _Disk._last.path = None
        stored: tuple[Any, ...] = super().store(value, read, key=key)
        filename = stored[2]
        _Disk._last.path = None if filename is None else os.path.join(self._directory, filename)
        return stored

    def _write(self, full_path: str, iterator: Any, mode: str, encoding: str | None = None) -> int:
        try:
            written: int = super()._write(full_path, iterator, mode, encoding)
        except FileExistsError:
            raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            raise
        return written

    @staticmethod
    def clear_last() -> None:
        """Before an ``add``: a failure before ``store`` must not delete an earlier, committed file."""
        _Disk._last.path = None

    @staticmethod
    def forget_last() -> None:
        """Delete the file this thread stored last (its row was not committed)."""
        path, _Disk._last.path = getattr(_Disk._last, "path", None), None
        if path is not None:
            with contextlib.suppress(OSError):
                os.remove(path)


_DATA_SETTINGS: dict[str, Any] = {"cull_limit": 0, "disk_min_file_size": 0, "disk": _Disk}


def _rollback(cache: diskcache.Cache) -> None:
    """End a transaction a failed COMMIT may have left open on this thread's connection
    (diskcache would otherwise retry ``BEGIN IMMEDIATE`` on it for ever)."""
    with contextlib.suppress(sqlite3.Error):
        cache._con.execute("ROLLBACK")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache; counters are this process's only."""

    bytes: int
    capacity: int
    pinned_bytes: int
    entries: int
    hits: int
    misses: int
    bytes_read: int
    bytes_written: int
    evictions: int
    corrupt_dropped: int = 0
    """Entries whose bytes no longer hashed to their digest when read, deleted (refetched on demand)."""


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0
    corrupt_dropped: int = 0


def _require_digest(digest: str) -> None:
    """Reject malformed keys early: they could never match any chunk."""
    if not isinstance(digest, str) or not is_digest(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")


def _fetch(cache: diskcache.Cache, digest: str) -> bytes | None:
    """Read a value, reading the file outside diskcache's transaction."""
    value = cache.get(digest, read=True, retry=True)
    if value is None or isinstance(value, bytes):
        return value
    with value:
        data: bytes = value.read()
    return data


class ChunkStore:
    """Disk cache of chunks keyed by sha256, safe to share between processes."""

    def __init__(self, directory: Path, *, size_limit: int, holder: str) -> None:
        if size_limit < 0:
            raise ValueError("size_limit must be >= 0")
        if not holder:
            raise ValueError("holder must be a non-empty id")
        self._size_limit = size_limit
        self._holder_key = _HOLDER_PREFIX + holder
        self._holder = holder
        self._counters = _Counters()
        self._lock = threading.Lock()
        root = Path(directory)
        self._root = str(root)
        self._pinned = diskcache.Cache(str(root / "pinned"), eviction_policy="none", **_DATA_SETTINGS)
        self._lru = diskcache.Cache(str(root / "lru"), eviction_policy="least-recently-used", **_DATA_SETTINGS)
        self._pins = diskcache.Cache(str(root / "pins"), eviction_policy="none")
        self._reconcile()

    # -- reads ---------------------------------------------------------------

    def get(self, digest: str) -> bytes | None:
        """Return the chunk's bytes, or None; a corrupt entry is dropped."""
        _require_digest(digest)
        try:
            found = self._lookup(digest)
        except sqlite3.OperationalError as exc:  # the access-time update of a full disk
            raise _write_error(exc, f"read chunk {digest[:12]}", self._root) from exc
        if found is not None:
            cache, data = found
            if chunk_digest(data) == digest:
                self._count(hits=1, bytes_read=len(data))
                return data
            # Changed on disk since it was verified and put: never hand it out; the caller
            # sees a miss and fetches the chunk again.
            log.warning("cache entry %s failed verification on read; dropped", digest[:12])
            cache.delete(digest, retry=True)
            self._count(corrupt_dropped=1)
        self._count(misses=1)
        return None

    def has(self, digest: str) -> bool:
        """True if the chunk is stored; touches neither LRU order nor counters."""
        _require_digest(digest)
        return digest in self._lru or digest in self._pinned or digest in self._lru

    def has_many(self, digests: Iterable[str]) -> set[str]:
        """The subset of ``digests`` that is stored."""
        return {d for d in digests if self.has(d)}

    def pinned(self) -> set[str]:
        """This holder's pins (stored or not)."""
        return set(self._pins.get(self._holder_key, ()))

    def stats(self) -> CacheStats:
        """Sizes from the shared databases, counters from this process."""
        pinned_bytes = int(self._pinned.reset("size"))
        with self._lock:
            c = _Counters(**vars(self._counters))
        return CacheStats(
            bytes=pinned_bytes + int(self._lru.reset("size")),
            capacity=self._size_limit,
            pinned_bytes=pinned_bytes,
            entries=len(self._pinned) + len(self._lru),
            hits=c.hits,
            misses=c.misses,
            bytes_read=c.bytes_read,
            bytes_written=c.bytes_written,
            evictions=c.evictions,
            corrupt_dropped=c.corrupt_dropped,
        )

    # -- writes --------------------------------------------------------------

    def put(self, digest: str, data: bytes) -> bool:
        """Store verified bytes; False if the chunk was already there."""
        _require_digest(digest)
        if chunk_digest(data) != digest:
            raise CorruptChunk(f"data does not hash to {digest}")
        if self.has(digest):
            return False
        try:
            with self._pins.transact(retry=True):
                if self.has(digest):
                    return False
                target = self._pinned if self._pins.get(digest) else self._lru
                _Disk.clear_last()
                try:
                    added = bool(target.add(digest, bytes(data), retry=True))
                except BaseException:
                    _rollback(target)  # so the row is surely not there: its file can go
                    _Disk.forget_last()
                    raise
                if added:
                    self._evict_to_fit()
        except (OSError, sqlite3.OperationalError) as exc:
            raise _write_error(exc, f"store chunk {digest[:12]} ({len(data)} bytes)", self._root) from exc
        if added:
            self._count(bytes_written=len(data))
        return added

    def set_pins(self, digests: Iterable[str]) -> None:
        """Replace this holder's pins; chunks nobody pins become evictable."""
        new = set(digests)
        for digest in new:
            _require_digest(digest)
        try:
            with self._pins.transact(retry=True):
                old = self.pinned()
                for digest in new - old:
                    self._add_holder(digest)
                for digest in old - new:
                    self._remove_holder(digest)
                self._pins.set(self._holder_key, tuple(sorted(new)), retry=True)
                self._evict_to_fit()
        except (OSError, sqlite3.OperationalError) as exc:
            raise _write_error(exc, "record pins", self._root) from exc

    def close(self) -> None:
        """Close this process's database connections (idempotent)."""
        for cache in (self._pinned, self._lru, self._pins):
            cache.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + delta)

    def _lookup(self, digest: str) -> tuple[diskcache.Cache, bytes] | None:
        """Find a chunk in lru, pinned, lru order (safe against moves)."""
        for cache in (self._lru, self._pinned, self._lru):
            data = _fetch(cache, digest)
            if data is not None:
                return cache, data
        return None

    def _add_holder(self, digest: str) -> None:
        holders: tuple[str, ...] = self._pins.get(digest, ())
        if self._holder not in holders:
            self._pins.set(digest, (*holders, self._holder), retry=True)
        self._move(digest, self._lru, self._pinned)

    def _remove_holder(self, digest: str) -> None:
        holders = tuple(h for h in self._pins.get(digest, ()) if h != self._holder)
        if holders:
            self._pins.set(digest, holders, retry=True)
            return
        self._pins.delete(digest, retry=True)
        self._move(digest, self._pinned, self._lru)

    def _move(self, digest: str, src: diskcache.Cache, dst: diskcache.Cache) -> None:
        """Copy then delete, so the chunk is always visible somewhere."""
        if digest not in src:
            return
        if digest not in dst:
            data = _fetch(src, digest)
            if data is None:
                return
            _Disk.clear_last()
            try:
                dst.add(digest, data, retry=True)
            except BaseException:
                _rollback(dst)
                _Disk.forget_last()
                raise
        src.delete(digest, retry=True)

    def _evict_to_fit(self) -> None:
        """Delete least recently used unpinned chunks until under the limit.

        Runs under the pins lock (pinned volume is stable) and the lru lock
        (no get can reorder rows while victims are picked).
        """
        with self._lru.transact(retry=True):
            budget = self._size_limit - int(self._pinned.reset("size"))
            used = int(self._lru.reset("size"))
            if used <= budget:
                return
            for key, size in self._lru_order():
                if used <= budget:
                    break
                if self._lru.delete(key, retry=True):
                    used -= size
                    self._count(evictions=1)

    def _lru_order(self) -> Iterator[tuple[str, int]]:
        """Rows of ``lru/`` oldest first, read from its SQLite table."""
        path = Path(self._lru.directory) / DBNAME
        with closing(sqlite3.connect(path, timeout=60)) as con:
            query = "SELECT key, size FROM Cache ORDER BY access_time, rowid"
            yield from con.execute(query)

    def _reconcile(self) -> None:
        """Put every chunk back where the pins say, after a crash mid-move."""
        with self._pins.transact(retry=True):
            pinned_keys = [k for k in list(self._pins) if is_digest(str(k))]
            for digest in pinned_keys:
                self._move(digest, self._lru, self._pinned)
            for digest in list(self._pinned):
                if not self._pins.get(digest):
                    self._move(digest, self._pinned, self._lru)
            self._evict_to_fit()
