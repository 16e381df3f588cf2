"""``<data_dir>/versions/<name>/<version>/model.onnx`` plus ``manifest.json``.

The model is written under a temp name, fsynced, checked against the manifest's
sha256 and renamed; ``manifest.json`` is written last and marks the version
complete. A crash at any point leaves no file that looks complete but is not; the temp
files a killed process leaves behind are removed when the next one opens the directory.
A write that fails (a full disk) removes what it wrote and raises ``VersionWriteError``
naming the directory.

A version served again (after a restart) is checked against its manifest: re-hashed only
when its file changed since it was last hashed. ``.verified`` records the file's sha256
with its size, inode, mtime and ctime at that moment; any write to the file or a file
put in its place changes the ctime (which no unprivileged process can set back), so a
matching stamp means the bytes hashed are the bytes there, and a start does not read
every model file whole again."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from edge_node.diskerrors import write_error
from fleetwire.manifest import Manifest

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
#: The model file's sha256 and stat when last hashed (see the module's docstring).
VERIFIED_FILE = ".verified"
#: Prefixes of the temp files written before their atomic rename.
_TEMP_PREFIXES = (".assemble-", ".manifest-")


class AssemblyError(Exception):
    """The chunks did not add up to the manifest's file."""


class VersionWriteError(OSError):
    """A version's files could not be written (typically a full disk); names the directory."""


def _write_error(exc: OSError, what: str, directory: Path) -> VersionWriteError:
    return write_error(VersionWriteError, exc, f"cannot write {what} in {directory}")


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamp(model: Path, sha256: str) -> str:
    st = model.stat()
    return f"{sha256} {st.st_size} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns}"


def _record_verified(model: Path, sha256: str, stamp: str | None = None) -> None:
    """Remember that ``model`` hashed to ``sha256`` (``stamp``: taken before it was hashed;
    default: now). Best effort: without the stamp the next check hashes the file again."""
    try:
        (model.parent / VERIFIED_FILE).write_text(stamp or _stamp(model, sha256))
    except OSError as exc:
        log.debug("cannot record %s as verified: %s", model, exc)


def _verified_unchanged(model: Path, stamp: str) -> bool:
    try:
        return (model.parent / VERIFIED_FILE).read_text() == stamp
    except OSError:
        return False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class VersionFiles:
    """Complete model versions on this node's disk."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()

    def _remove_stale_temps(self) -> None:
        """Delete half-written files of a process that died while writing (one writer per data dir)."""
        for prefix in _TEMP_PREFIXES:
            for stale in self.root.glob(f"*/*/{prefix}*"):
                stale.unlink(missing_ok=True)

    def directory(self, name: str, version: str) -> Path:
        """The directory of one version."""
        return self.root / name / version

    def model_path(self, name: str, version: str) -> Path:
        """The assembled model file of one version."""
        return self.directory(name, version) / MODEL_FILE

    def is_complete(self, manifest: Manifest) -> bool:
        """True when the version was assembled before and its file still has the manifest's
        size and sha256 (re-hashed when it changed since it was last hashed: a file changed
        on disk is assembled again)."""
        marker = self.directory(manifest.name, manifest.version) / MANIFEST_FILE
        model = self.model_path(manifest.name, manifest.version)
        if not marker.is_file() or not model.is_file():
            return False
        try:
            if Manifest.model_validate_json(marker.read_text()).sha256 != manifest.sha256:
                return False
        except ValueError:
            return False
        stamp = _stamp(model, manifest.sha256)  # before hashing: a write while it is read changes it
        if _verified_unchanged(model, stamp):
            return True
        if model.stat().st_size == manifest.size and _file_sha256(model) == manifest.sha256:
            _record_verified(model, manifest.sha256, stamp)
            return True
        log.warning("%s:%s on disk does not match its manifest; assembling it again", manifest.name, manifest.version)
        return False

    def latest_complete(self, name: str, exclude: str) -> Manifest | None:
        """The most recently completed version of ``name`` on disk other than ``exclude`` whose
        file still matches its manifest (``is_complete``)."""
        found: list[tuple[float, Manifest]] = []
        for marker in (self.root / name).glob(f"*/{MANIFEST_FILE}"):
            if marker.parent.name == exclude or not (marker.parent / MODEL_FILE).is_file():
                continue
            try:
                manifest = Manifest.model_validate_json(marker.read_text())
            except (OSError, ValueError):
                continue
            if (manifest.name, manifest.version) == (name, marker.parent.name):
                found.append((marker.stat().st_mtime, manifest))
        found.sort(key=lambda f: f[0], reverse=True)
        return next((manifest for _, manifest in found if self.is_complete(manifest)), None)

    def assemble(self, manifest: Manifest, read: Callable[[str], bytes | None]) -> Path:
        """Concatenate the chunks, verify the whole file, and publish it atomically."""
        directory = self.directory(manifest.name, manifest.version)
        directory.mkdir(parents=True, exist_ok=True)
        what = f"{manifest.name}:{manifest.version} ({manifest.size} bytes)"
        try:
            fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".assemble-")
        except OSError as exc:
            raise _write_error(exc, what, directory) from exc
        tmp = Path(tmp_name)
        final = directory / MODEL_FILE
        try:
            digest = self._write_chunks(fd, manifest, read)
            if digest != manifest.sha256:
                raise AssemblyError(f"{manifest.name}:{manifest.version}: assembled file has sha256 {digest}")
            os.replace(tmp, final)
            self._write_marker(directory, manifest)
            _fsync_dir(directory)
        except OSError as exc:
            if not (directory / MANIFEST_FILE).is_file():  # not complete: give its room back
                final.unlink(missing_ok=True)
            raise _write_error(exc, what, directory) from exc
        finally:
            tmp.unlink(missing_ok=True)
        _record_verified(final, manifest.sha256)  # hashed above, while it was written
        return final

    @staticmethod
    def _write_chunks(fd: int, manifest: Manifest, read: Callable[[str], bytes | None]) -> str:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as f:
            for chunk in manifest.chunks:
                data = read(chunk.digest)
                if data is None:
                    raise AssemblyError(f"chunk {chunk.digest[:12]} vanished from the cache")
                h.update(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return h.hexdigest()

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
        """Delete a version's directory."""
        shutil.rmtree(self.directory(name, version), ignore_errors=True)
