"""Verified records: what lets a restarted edge serve a multi-GB model without reading it.

Each artifact directory keeps ``.verified.json``: for every file verified there (assembled
from digest-checked chunks, or re-hashed), the sha256 it was checked against and the file's
stat at that moment — size, ``mtime_ns``, ``ctime_ns`` and inode. ``VersionFiles.is_complete``
trusts a file whose stat still equals its entry *and* whose entry names the sha256 the
signed manifest wants; every other file (no entry, a stat that moved, another digest, an
unreadable record) is re-hashed, and the entry renewed if it hashes right.

Why the stat is enough for accidents and for ordinary writers: any write through the file
system moves ``ctime`` to the current time, and no user call can set ``ctime`` back
(``os.utime`` sets atime and mtime only, and itself moves ctime); a file replaced by a rename
or a copy gets another inode. What can change the bytes and leave the stat alone (the
residual risk, docs/reliability.md): the medium itself (bit rot, a controller or firmware
fault), a write to the raw block device or a file-system image edited offline, the clock set
back by root to the exact recorded nanosecond before a write, and, on a file system whose
timestamps are coarse, a write in the same tick as the verification (an entry whose ctime is
not older than the record file itself is treated as unverified for that reason, as git does
with its index). ``versions.rehash_all`` turns the records off for an operator who wants the
full check at every start.

The record is local state on the same disk as the model: whoever can rewrite the record can
rewrite the model and the edge's own code too, so it is neither signed nor trusted for more
than "this inode, unchanged since, hashed to that" (docs/security.md). A record that is
corrupt, from another file system, or names another digest only costs a re-hash."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["RECORD_FILE", "RECORD_TEMP_PREFIX", "FileStat", "VerificationStats", "VerifiedRecord"]

#: The record in each artifact directory (a dot name: no model file can have it).
RECORD_FILE = ".verified.json"
#: Prefix of the record's temp file before its atomic rename.
RECORD_TEMP_PREFIX = ".verified-"
_FORMAT = 1
#: Waits before re-writing a record whose entries are as new as the record itself (a file
#: system with coarse timestamps): after them the entries stay unverified until re-hashed.
_RACY_WAITS_S = (0.005, 0.02, 0.1)


@dataclass(frozen=True)
class FileStat:
    """What of a file's stat must stay the same for its record to hold."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        """The parts of ``st`` a record keeps. The device number is left out: it can change
        across reboots or container restarts (overlay, re-ordered disks) and would only cost
        re-hashes, while inode plus ctime already pin the file."""
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass
class VerificationStats:
    """What the checks of complete versions cost since the store opened (``/api/v1/status``);
    checks run in worker threads, hence the lock."""

    files_trusted: int = 0
    """Files taken as verified from their record, unread."""
    bytes_trusted: int = 0
    files_rehashed: int = 0
    """Files read and hashed again (no record, a changed stat, or ``rehash_all``)."""
    bytes_rehashed: int = 0
    files_mismatched: int = 0
    """Re-hashed files whose bytes no longer match the manifest (assembled again)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def trusted(self, size: int) -> None:
        """A file of ``size`` bytes was taken from its record."""
        with self._lock:
            self.files_trusted += 1
            self.bytes_trusted += size

    def rehashed(self, size: int, matched: bool) -> None:
        """A file of ``size`` bytes was read and hashed; ``matched``: it had the manifest's sha256."""
        with self._lock:
            self.files_rehashed += 1
            self.bytes_rehashed += size
            self.files_mismatched += 0 if matched else 1

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


@dataclass(frozen=True)
class _Entry:
    sha256: str
    stat: FileStat


class VerifiedRecord:
    """The record of one artifact directory: file name → the digest it verified against and
    its stat then. ``load`` never fails (a bad record is an empty one); ``save`` is atomic."""

    def __init__(self, directory: Path, entries: dict[str, _Entry] | None = None, written_ns: int = 0) -> None:
        self.directory = directory
        self._entries = dict(entries or {})
        self._written_ns = written_ns
        self.changed = False

    @property
    def path(self) -> Path:
        """Where the record lies."""
        return self.directory / RECORD_FILE

    @classmethod
    def load(cls, directory: Path) -> VerifiedRecord:
        """The record kept in ``directory``, or an empty one when it is missing or unreadable."""
        path = directory / RECORD_FILE
        try:
            written_ns = path.stat().st_mtime_ns
            doc = json.loads(path.read_text())
            entries = {name: _entry(raw) for name, raw in doc["files"].items()} if doc.get("format") == _FORMAT else {}
        except FileNotFoundError:
            return cls(directory)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the unreadable verified record %s (%s); its files are re-hashed", path, exc)
            return cls(directory)
        return cls(directory, entries, written_ns)

    def vouches(self, name: str, sha256: str, stat: FileStat) -> bool:
        """Whether ``name`` was verified against ``sha256`` and is, by its stat, unchanged since.
        An entry as new as the record file itself is not trusted (a coarse-timestamp file
        system could hide a write in the same tick)."""
        entry = self._entries.get(name)
        return entry is not None and entry.sha256 == sha256 and entry.stat == stat and stat.ctime_ns < self._written_ns

    def note(self, name: str, sha256: str, stat: FileStat) -> None:
        """``name`` (its stat ``stat``) was just verified against ``sha256``."""
        if self._entries.get(name) != _Entry(sha256, stat) or stat.ctime_ns >= self._written_ns:
            self._entries[name] = _Entry(sha256, stat)
            self.changed = True

    def forget(self, name: str) -> None:
        """``name`` did not verify: drop its entry."""
        if self._entries.pop(name, None) is not None:
            self.changed = True

    def save(self) -> None:
        """Write the record atomically (temp file, fsync, rename). Re-written after a short wait
        while its own mtime is not newer than an entry's ctime. Never raises: a record that
        cannot be written (a full disk) only means re-hashing at the next check."""
        try:
            for wait in (*_RACY_WAITS_S, None):
                self._write()
                self._written_ns = self.path.stat().st_mtime_ns
                if wait is None or all(e.stat.ctime_ns < self._written_ns for e in self._entries.values()):
                    break
                time.sleep(wait)
            self.changed = False
        except OSError as exc:
            log.warning("cannot write the verified record %s (%s); its files are re-hashed next time", self.path, exc)

    def _write(self) -> None:
        doc: dict[str, Any] = {
            "format": _FORMAT,
            "files": {name: {"sha256": e.sha256, **asdict(e.stat)} for name, e in sorted(self._entries.items())},
        }
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=RECORD_TEMP_PREFIX)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            Path(tmp).unlink(missing_ok=True)


def _entry(raw: dict[str, Any]) -> _Entry:
    """One entry of a record file; ``TypeError``/``KeyError``/``ValueError`` if malformed."""
    stat = FileStat(int(raw["size"]), int(raw["mtime_ns"]), int(raw["ctime_ns"]), int(raw["ino"]))
    sha256 = raw["sha256"]
    if not isinstance(sha256, str):
        raise TypeError("sha256 is not a string")
    return _Entry(sha256, stat)
