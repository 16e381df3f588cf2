"""Uploads are streamed into a staging directory, one per push, hashed on the way and never
held in memory: a model of several GiB arrives in blocks of about a MiB.

A push's directory ends up shaped like the version an edge assembles: the graph as
``model.onnx`` next to its external-data files (``bundle.arrange`` names them). The size
limit counts every file of the push and is enforced while the bytes arrive, so an
oversized body is cut off at the limit, not after it has all arrived; free disk is
checked before a file is written (when its size is known) and every few hundred MiB while
it is, so a push that does not fit fails with 507 and a clear message, not with a full disk
under the blob store. Whatever fails, ``discard`` removes the whole directory."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from central.errors import BadRequest, InsufficientStorage, TooLarge

#: The name of a push's graph file in its staging directory (and of every artifact's on an edge).
GRAPH_FILE = "model.onnx"
#: A staged calibration file: a leading dot keeps it out of the data files' name space.
CALIBRATION_FILE = ".calibration.npz"
#: The name an ``eval`` part (inputs plus labels for the guard) gets in the push's box.
EVAL_FILE = ".eval.npz"
#: Bytes written between two checks of the free disk space (``statvfs`` is cheap).
_ROOM_CHECK_BYTES = 256 * 1024 * 1024
#: Bytes gathered on the event loop before one write in a worker thread.
_WRITE_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class StagedFile:
    """One fully received file: where it is, its sha256 and size."""

    path: Path
    sha256: str
    size: int


@dataclass
class StagedUpload:
    """A push's model in its own staging directory: the graph (``model.onnx``) and the
    external-data files it references, by the name the graph uses."""

    directory: Path
    graph: StagedFile
    files: dict[str, StagedFile] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The graph file."""
        return self.graph.path

    @property
    def sha256(self) -> str:
        """The graph file's sha256."""
        return self.graph.sha256

    @property
    def size(self) -> int:
        """The graph file's size."""
        return self.graph.size

    @property
    def total_size(self) -> int:
        """The graph plus every data file."""
        return self.graph.size + sum(f.size for f in self.files.values())

    def discard(self) -> None:
        """Delete the push's staging directory and everything in it."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _no_room(root: Path, exc: OSError | None = None, needed: int | None = None, free: int | None = None) -> Exception:
    if needed is not None:
        return InsufficientStorage(
            f"central cannot stage this upload: it needs {needed} bytes and {free} are free on {root}"
            " (after keeping min_free_disk_bytes); free disk on central or push a smaller model"
        )
    return InsufficientStorage(f"central's disk is full while staging the upload in {root} ({exc}); nothing was kept")


class FileSink:
    """One file being written into a push's directory: hashed, counted against the push's
    limit, its disk checked as it grows; ``abort`` removes it.

    Bytes that arrive on the event loop go through ``feed``/``finish``: gathered into blocks
    of about a MiB, each written and hashed in a worker thread, so a disk slower than the
    network throttles the upload, not the loop that also serves heartbeats and inference.
    Code already in a worker thread (tar extraction) calls ``write``/``close``. No fsync:
    staging is wiped at start-up, so a crash loses nothing a sync would have kept; the
    chunks cut from the file are the durable copy (each fsynced by the blob store)."""

    def __init__(self, box: StagingBox, path: Path) -> None:
        self._box = box
        self.path = path
        self._file = path.open("xb")
        self._hash = hashlib.sha256()
        self.size = 0
        self._unchecked = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def _account(self, n: int) -> None:
        """Count ``n`` more bytes: ``TooLarge`` past the push's limit, ``InsufficientStorage``
        when the disk is (nearly) full."""
        self._box.count(n)
        self._unchecked += n
        if self._unchecked >= _ROOM_CHECK_BYTES:
            self._unchecked = 0
            self._box.staging.check_room(0)

    def _put(self, block: bytes) -> None:
        self._hash.update(block)
        try:
            self._file.write(block)
        except OSError as exc:
            raise self._box.staging.write_failed(exc) from exc
        self.size += len(block)

    def write(self, block: bytes) -> None:
        """Append ``block`` now (from a worker thread)."""
        self._account(len(block))
        self._put(block)

    async def feed(self, block: bytes) -> None:
        """Append ``block`` (from the event loop); written once a MiB has gathered."""
        self._account(len(block))
        self._pending.append(block)
        self._pending_bytes += len(block)
        if self._pending_bytes >= _WRITE_BLOCK:
            await self._drain()

    async def _drain(self) -> None:
        block = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        if block:
            await asyncio.to_thread(self._put, block)

    async def finish(self) -> StagedFile:
        """Write what ``feed`` gathered and close (from the event loop)."""
        await self._drain()
        return await asyncio.to_thread(self.close)

    def close(self) -> StagedFile:
        """Flush and close; the file as staged."""
        try:
            self._file.flush()
        except OSError as exc:
            raise self._box.staging.write_failed(exc) from exc
        finally:
            self._file.close()
        return StagedFile(self.path, self._hash.hexdigest(), self.size)

    def abort(self) -> None:
        """Close and delete the partial file."""
        self._file.close()
        self.path.unlink(missing_ok=True)


class StagingBox:
    """One push's staging directory while its files arrive; the limit counts all of them."""

    def __init__(self, staging: Staging, directory: Path) -> None:
        self.staging = staging
        self.directory = directory
        self.received = 0
        self._parts = 0

    def count(self, n: int) -> None:
        """Add ``n`` bytes to the push's total; ``TooLarge`` past the limit."""
        self.received += n
        if self.received > self.staging.limit:
            raise TooLarge(
                f"upload exceeds the limit of {self.staging.limit} bytes (max_upload_bytes), counting every file"
            )

    def sink(self, name: str | None = None, expected: int | None = None) -> FileSink:
        """A new file in the box: ``name``, or a temp name (``.part-N``) to be renamed later.
        ``expected``: its size when known (a tar member), checked against limit and disk first."""
        if expected is not None:
            if self.received + expected > self.staging.limit:
                raise TooLarge(
                    f"upload exceeds the limit of {self.staging.limit} bytes (max_upload_bytes), counting every file"
                )
            self.staging.check_room(expected)
        while name is None or (name.startswith(".part-") and (self.directory / name).exists()):
            self._parts += 1
            name = f".part-{self._parts}"
        try:
            return FileSink(self, self.directory / name)
        except FileExistsError as exc:
            raise BadRequest(f"the upload holds two files named {name!r}") from exc
        except OSError as exc:
            raise self.staging.write_failed(exc) from exc

    async def receive(self, body: AsyncIterator[bytes], name: str | None = None) -> StagedFile:
        """Stream ``body`` into a new file of the box (see ``sink``)."""
        sink = self.sink(name)
        try:
            async for block in body:
                await sink.feed(block)
            return await sink.finish()
        except BaseException:
            sink.abort()
            raise

    def discard(self) -> None:
        """Delete the box and everything in it."""
        shutil.rmtree(self.directory, ignore_errors=True)


class Staging:
    """The staging directory; emptied at start-up, since nothing there is committed."""

    def __init__(self, root: Path, limit: int, min_free_bytes: int = 0) -> None:
        self.root = root
        self.limit = limit
        #: Free disk a push must leave on the staging filesystem.
        self.min_free_bytes = min_free_bytes
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)

    def check_room(self, needed: int) -> None:
        """``InsufficientStorage`` unless ``needed`` more bytes fit and leave ``min_free_bytes``."""
        free = shutil.disk_usage(self.root).free
        if needed + self.min_free_bytes > free:
            raise _no_room(self.root, needed=needed + self.min_free_bytes, free=free)

    def check_declared(self, length: int) -> None:
        """Refuse a body whose declared length is over the limit (413) or cannot fit (507).

        A push needs room for its upload here and for its chunks in the blob store (the same
        filesystem, normally): twice the upload, at worst, before anything is deduplicated."""
        if length > self.limit:
            raise TooLarge(f"upload of {length} bytes exceeds the limit of {self.limit} bytes (max_upload_bytes)")
        self.check_room(2 * length)

    def write_failed(self, exc: OSError) -> Exception:
        """The error to raise for a failed staging write: 507 for a full disk, else the OSError."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return _no_room(self.root, exc)
        return exc

    def open(self) -> StagingBox:
        """A new, empty directory for one push (``upload-…``)."""
        return StagingBox(self, Path(tempfile.mkdtemp(dir=self.root, prefix="upload-")))
