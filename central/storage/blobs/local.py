"""Content-addressed chunk blobs on the local filesystem (the default ``ChunkBlobs``), files
under ``<data_dir>/blobs/sha256/ab/abcdef…``.

Every write is temp file + fsync + rename + directory fsync, so a crash leaves either
the whole blob or nothing under its name. A blob is only ever written under the
digest of the bytes actually written, and every read checks that digest again, so a
wrong chunk can never be served (``CorruptBlob``). The S3 implementation is
``central.storage.blobs.s3``."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from central.storage.protocols import CorruptBlob
from fleetwire.digest import chunk_digest, is_digest

_READ_PIECE = 64 * 1024


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def check_digest(digest: str) -> None:
    """ValueError unless ``digest`` is a lowercase sha256 hex digest."""
    if not is_digest(digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")


def verified(digest: str, data: bytes) -> bytes:
    """``data`` when it hashes to ``digest``, else ``CorruptBlob``."""
    if chunk_digest(data) != digest:
        raise CorruptBlob(f"blob {digest[:12]} is corrupt in the store (its bytes hash otherwise)")
    return data


class BlobStore:
    """Chunks by sha256 on the local filesystem (the default ``ChunkBlobs``). ``grace_s``: a
    blob modified less than this long ago is not deleted (0: one central owns the directory)."""

    def __init__(self, root: Path, grace_s: float = 0.0) -> None:
        self.root = root / "sha256"
        self.root.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s

    def path(self, digest: str) -> Path:
        """Where the blob for ``digest`` lives (whether or not it exists)."""
        check_digest(digest)
        return self.root / digest[:2] / digest

    def has(self, digest: str) -> bool:
        """True when the blob is stored."""
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        """Size in bytes of a stored blob."""
        return self.path(digest).stat().st_size

    def put(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its own digest (idempotent); returns (digest, newly stored)."""
        digest = chunk_digest(data)
        target = self.path(digest)
        if target.is_file():
            return digest, False
        atomic_write(target, data)
        return digest, True

    def read(self, digest: str) -> bytes:
        """The whole blob, checked against its digest."""
        return verified(digest, self.path(digest).read_bytes())

    def delete(self, digest: str) -> bool:
        """Delete the blob unless modified within ``grace_s``; True if deleted."""
        path = self.path(digest)
        try:
            if self.grace_s and time.time() - path.stat().st_mtime < self.grace_s:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def digests(self) -> Iterator[str]:
        """Every stored digest (temp files of writes in progress left out)."""
        for path in self.root.glob("*/*"):
            if is_digest(path.name) and path.is_file():
                yield path.name

    def usage(self) -> tuple[int, int]:
        """(blobs, bytes) stored; one stat per blob."""
        count = size = 0
        for digest in self.digests():
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                size += self.path(digest).stat().st_size
                count += 1
        return count, size

    def iter_pieces(self, digest: str, piece: int = _READ_PIECE) -> Iterator[bytes]:
        """The blob in pieces, for streaming without holding it whole."""
        with self.path(digest).open("rb") as f:
            while block := f.read(piece):
                yield block

    def remove_temp_files(self) -> int:
        """Delete temp files a crash left behind; returns how many."""
        count = 0
        for tmp in self.root.glob("*/.tmp-*"):
            tmp.unlink(missing_ok=True)
            count += 1
        return count
