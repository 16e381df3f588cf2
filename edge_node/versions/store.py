"""``<data_dir>/versions/<name>/<version>/model.onnx`` plus ``manifest.json``.

The model is written under a temp name, fsynced, checked against the manifest's
sha256 and renamed; ``manifest.json`` is written last and marks the version
complete. A crash at any point leaves no file that looks complete but is not; the temp
files a killed process leaves behind are removed when the next one opens the directory.
A write that fails (a full disk) removes what it wrote and raises ``VersionWriteError``
naming the directory."""

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
        size and sha256 (re-hashed: a file changed on disk since is assembled again)."""
        marker = self.directory(manifest.name, manifest.version) / MANIFEST_FILE
        model = self.model_path(manifest.name, manifest.version)
        if not marker.is_file() or not model.is_file():
            return False
        try:
            if Manifest.model_validate_json(marker.read_text()).sha256 != manifest.sha256:
                return False
        except ValueError:
            return False
        if model.stat().st_size == manifest.size and _file_sha256(model) == manifest.sha256:
            return True
        log.warning("%s:%s on disk does not match its manifest; assembling it again", manifest.name, manifest.version)
        return False

    def latest_complete(self, name: str, exclude: str) -> Manifest | None:
        """The most recently completed version of ``name`` on disk other than ``exclude`` whose
        file still matches its manifest (``is_complete``: re-hashed)."""
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
            return final
        except OSError as exc:
            if not (directory / MANIFEST_FILE).is_file():  # not complete: give its room back
                final.unlink(missing_ok=True)
            raise _write_error(exc, what, directory) from exc
        finally:
            tmp.unlink(missing_ok=True)

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
