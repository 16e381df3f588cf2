"""``<data_dir>/versions/<name>/<version>/<artifact>/``: ``model.onnx``, its external-data
files (as the graph names them) and ``manifest.json``.

An artifact is assembled file by file: each is written under a temp name from its chunks,
fsynced, checked against its sha256 and renamed; ``manifest.json`` is written last and
marks the artifact complete, so a crash at any point leaves no directory that looks
complete but is not, and ORT, which resolves external data relative to ``model.onnx``,
only ever sees whole files. The temp files a killed process leaves behind are removed
when the next one opens the directory. A write that fails (a full disk) removes what it
wrote and raises ``VersionWriteError`` naming the directory.

Checking that a complete artifact is still whole (``is_complete``, at every start) reads only
the files whose stat moved since they were last verified: ``verified.py`` keeps a record per
artifact directory, written when its files are assembled or re-hashed, so a warm restart of
an edge serving a multi-GB model reads none of it.

Edges before artifacts had their own directories kept ``model.onnx`` and ``manifest.json``
in the version's directory; opening the store moves them into their artifact's directory
(two renames), so an edge upgraded in place finds its versions and serves them at once."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_node.diskerrors import write_error
from edge_node.versions.verified import RECORD_TEMP_PREFIX, FileStat, VerificationStats, VerifiedRecord
from fleetwire import names
from fleetwire.manifest import MODEL_FILE, ArtifactRef, ChunkRef, Manifest

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
#: Prefixes of the temp files written before their atomic rename.
_TEMP_PREFIXES = (".assemble-", ".manifest-", RECORD_TEMP_PREFIX)

__all__ = [
    "MANIFEST_FILE",
    "MODEL_FILE",
    "AssemblyError",
    "StoredFile",
    "VersionFiles",
    "VersionWriteError",
    "artifact_files",
]


class AssemblyError(Exception):
    """The chunks did not add up to the manifest's file."""


class VersionWriteError(OSError):
    """A version's files could not be written (typically a full disk); names the directory."""


def _write_error(exc: OSError, what: str, directory: Path) -> VersionWriteError:
    return write_error(VersionWriteError, exc, f"cannot write {what} in {directory}")


def _hashed_unchanged(path: Path) -> tuple[str, FileStat | None]:
    """The sha256 of ``path`` and its stat, or None for the stat when the file changed while
    it was read (then nothing may be recorded about it)."""
    with path.open("rb") as f:
        before = FileStat.of(os.fstat(f.fileno()))
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        after = FileStat.of(os.fstat(f.fileno()))
    return digest, before if before == after else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StoredFile:
    """One file of an artifact as it lies in the artifact's directory."""

    path: str
    sha256: str
    size: int
    chunks: list[ChunkRef]


def artifact_files(artifact: ArtifactRef) -> list[StoredFile]:
    """Every file of an artifact: the graph (``model.onnx``) first, then its data files."""
    graph = StoredFile(MODEL_FILE, artifact.sha256, artifact.size, artifact.chunks)
    return [graph, *(StoredFile(f.path, f.sha256, f.size, f.chunks) for f in artifact.files)]


def _artifact(manifest: Manifest, artifact: str | None) -> ArtifactRef:
    """The named artifact of ``manifest`` (None: the served one); ``KeyError`` if it has none."""
    ref = manifest.served() if artifact is None else manifest.artifact_named(artifact)
    if ref is None:
        raise KeyError(f"{manifest.name}:{manifest.version} has no artifact {artifact!r}")
    names.check_name("artifact", ref.artifact)  # a directory name: path-safe (the manifest is signed too)
    return ref


def _same_files(a: ArtifactRef, b: ArtifactRef) -> bool:
    return a.sha256 == b.sha256 and [(f.path, f.sha256) for f in a.files] == [(f.path, f.sha256) for f in b.files]


class VersionFiles:
    """Complete model versions on this node's disk, one directory per artifact. With
    ``rehash_all`` every check reads every file again and the verified records are not
    trusted (what edges did before them: it also catches bytes that rotted under an
    unchanged stat, at the cost of reading the whole model at every start)."""

    def __init__(self, root: Path, *, rehash_all: bool = False) -> None:
        self.root = root
        self.rehash_all = rehash_all
        #: What the checks of complete versions read (and trusted unread) since opening.
        self.verification = VerificationStats()
        root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        self._move_legacy_versions()

    def _remove_stale_temps(self) -> None:
        """Delete half-written files of a process that died while writing (one writer per data dir)."""
        for prefix in _TEMP_PREFIXES:
            for pattern in (f"*/*/{prefix}*", f"*/*/*/{prefix}*"):
                for stale in self.root.glob(pattern):
                    stale.unlink(missing_ok=True)

    def _move_legacy_versions(self) -> None:
        """Move ``<version>/model.onnx`` + ``manifest.json`` (the layout before artifact
        directories) into ``<version>/<artifact>/``. Each step is a rename and the marker
        moves last, so a crash in between leaves a directory that is simply re-assembled."""
        for marker in self.root.glob(f"*/*/{MANIFEST_FILE}"):
            try:
                manifest = Manifest.model_validate_json(marker.read_text())
                target = self.root / marker.parent.parent.name / marker.parent.name / manifest.artifact
                names.check_name("artifact", manifest.artifact)
                target.mkdir(exist_ok=True)
                model = marker.parent / MODEL_FILE
                if model.is_file():
                    os.replace(model, target / MODEL_FILE)
                os.replace(marker, target / MANIFEST_FILE)
                _fsync_dir(target)
                _fsync_dir(marker.parent)
            except (OSError, ValueError) as exc:
                log.warning(
                    "cannot move %s into its artifact's directory (%s); it will be assembled again", marker, exc
                )
                continue
            log.info("moved %s:%s into %s", manifest.name, manifest.version, target)

    def directory(self, name: str, version: str) -> Path:
        """The directory of one version (its artifacts are subdirectories)."""
        return self.root / name / version

    def artifact_directory(self, name: str, version: str, artifact: str) -> Path:
        """The directory an artifact of a version is assembled in."""
        return self.directory(name, version) / names.check_name("artifact", artifact)

    def model_path(self, name: str, version: str, artifact: str | None = None) -> Path:
        """The graph file of one artifact of a version; None: the artifact most recently
        completed on this disk (the one the edge serves), else the default ``fp32``."""
        if artifact is None:
            markers = sorted(
                self.directory(name, version).glob(f"*/{MANIFEST_FILE}"),
                key=lambda m: m.stat().st_mtime,
            )
            artifact = markers[-1].parent.name if markers else "fp32"
        return self.artifact_directory(name, version, artifact) / MODEL_FILE

    def is_complete(self, manifest: Manifest, artifact: str | None = None) -> bool:
        """True when the artifact (None: the served one) was assembled before and every one
        of its files still has its size and sha256: re-hashed unless its verified record
        vouches for it (same digest, stat unchanged since); a file changed on disk since is
        assembled again."""
        ref = _artifact(manifest, artifact)
        directory = self.artifact_directory(manifest.name, manifest.version, ref.artifact)
        marker = directory / MANIFEST_FILE
        if not marker.is_file():
            return False
        try:
            recorded = Manifest.model_validate_json(marker.read_text()).artifact_named(ref.artifact)
        except (OSError, ValueError):
            return False
        if recorded is None or not _same_files(recorded, ref):
            return False
        record = VerifiedRecord.load(directory)
        whole = True
        for file in artifact_files(ref):
            if not self._still_whole(record, file):
                log.warning(
                    "%s:%s %s: %s on disk does not match its manifest; assembling it again",
                    manifest.name, manifest.version, ref.artifact, file.path,
                )  # fmt: skip
                whole = False
                break
        if record.changed:
            record.save()
        return whole

    def _still_whole(self, record: VerifiedRecord, file: StoredFile) -> bool:
        """Whether ``file`` in ``record``'s directory still has its size and sha256: trusted
        from the record, else re-hashed (and the record renewed or the entry dropped)."""
        path = record.directory / file.path
        try:
            st = path.stat()
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != file.size:
            record.forget(file.path)
            return False
        if not self.rehash_all and record.vouches(file.path, file.sha256, FileStat.of(st)):
            self.verification.trusted(file.size)
            return True
        try:
            digest, unchanged = _hashed_unchanged(path)
        except OSError:
            return False
        self.verification.rehashed(file.size, digest == file.sha256)
        if digest != file.sha256:
            if record.vouches(file.path, file.sha256, FileStat.of(st)):
                log.warning("%s changed on disk without a trace in its stat (bit rot, a raw write, or a forged %s)",
                            path, record.path.name)  # fmt: skip
            record.forget(file.path)
            return False
        if unchanged is not None:
            record.note(file.path, file.sha256, unchanged)
        return True

    def latest_complete(self, name: str, exclude: str) -> Manifest | None:
        """The most recently completed version of ``name`` on disk other than ``exclude`` whose
        files still match its manifest (``is_complete``). ``model_path(name,
        version)`` then names the artifact that completed."""
        found: list[tuple[float, Manifest, str]] = []
        for marker in (self.root / name).glob(f"*/*/{MANIFEST_FILE}"):
            version_dir = marker.parent.parent
            if version_dir.name == exclude or not (marker.parent / MODEL_FILE).is_file():
                continue
            try:
                manifest = Manifest.model_validate_json(marker.read_text())
            except (OSError, ValueError):
                continue
            if (manifest.name, manifest.version) == (name, version_dir.name):
                found.append((marker.stat().st_mtime, manifest, marker.parent.name))
        found.sort(key=lambda f: f[0], reverse=True)
        for _, manifest, artifact in found:
            try:
                if self.is_complete(manifest, artifact):
                    return manifest
            except (KeyError, names.InvalidName):
                continue
        return None

    def assemble(self, manifest: Manifest, read: Callable[[str], bytes | None], artifact: str | None = None) -> Path:
        """Write every file of the artifact (None: the served one) from its chunks, each
        verified and published atomically, then the marker; the path of its ``model.onnx``."""
        ref = _artifact(manifest, artifact)
        directory = self.artifact_directory(manifest.name, manifest.version, ref.artifact)
        what = f"{manifest.name}:{manifest.version} {ref.artifact} ({ref.total_size} bytes)"
        written: list[Path] = []
        record = VerifiedRecord(directory)  # the files are verified as they are written
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / MANIFEST_FILE).unlink(missing_ok=True)  # not complete while files change
            for file in artifact_files(ref):
                path, verified = self._assemble_file(directory, file, read, what)
                written.append(path)
                if verified is not None:
                    record.note(file.path, file.sha256, verified)
            self._write_marker(directory, manifest)
            _fsync_dir(directory)
            record.save()
            return directory / MODEL_FILE
        except OSError as exc:
            if not (directory / MANIFEST_FILE).is_file():  # not complete: give its room back
                for path in written:
                    path.unlink(missing_ok=True)
            raise _write_error(exc, what, directory) from exc

    @staticmethod
    def _assemble_file(
        directory: Path, file: StoredFile, read: Callable[[str], bytes | None], what: str
    ) -> tuple[Path, FileStat | None]:
        """One file from its chunks: temp name, fsync, sha256 check, rename; its path and its
        stat once renamed (None if something else touched it meanwhile: it is re-hashed later)."""
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".assemble-")
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as f:
                for chunk in file.chunks:
                    data = read(chunk.digest)
                    if data is None:
                        raise AssemblyError(f"{what}: chunk {chunk.digest[:12]} of {file.path} vanished from the cache")
                    h.update(data)
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
                written = os.fstat(f.fileno())
            if h.hexdigest() != file.sha256:
                raise AssemblyError(f"{what}: assembled {file.path} has sha256 {h.hexdigest()}")
            final = directory / file.path
            os.replace(tmp, final)
            renamed = final.stat()  # a rename moves ctime: the record keeps the stat after it
            same = (renamed.st_ino, renamed.st_size, renamed.st_mtime_ns) == (
                written.st_ino, written.st_size, written.st_mtime_ns,
            )  # fmt: skip
            return final, FileStat.of(renamed) if same else None
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _write_marker(directory: Path, manifest: Manifest) -> None:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(manifest.model_dump_json(indent=2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, directory / MANIFEST_FILE)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def remove(self, name: str, version: str) -> None:
        """Delete a version's directory (every artifact of it)."""
        shutil.rmtree(self.directory(name, version), ignore_errors=True)
