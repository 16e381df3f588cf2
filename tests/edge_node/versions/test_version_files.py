"""VersionFiles: a version served again is re-hashed only when its file changed."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from edge_node.versions import VersionFiles
from edge_node.versions.store import VERIFIED_FILE
from fleetwire.manifest import ChunkRef, Manifest

PARTS = [b"a" * 1000, b"b" * 500]


def _manifest() -> Manifest:
    whole = b"".join(PARTS)
    return Manifest(
        name="tiny",
        version="1",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        chunks=[ChunkRef(digest=hashlib.sha256(p).hexdigest(), size=len(p)) for p in PARTS],
        created_at="2026-01-01T00:00:00Z",
    )


def _assembled(root: Path) -> tuple[VersionFiles, Manifest, Path]:
    files, m = VersionFiles(root), _manifest()
    by_digest = {c.digest: p for c, p in zip(m.chunks, PARTS, strict=True)}
    return files, m, files.assemble(m, by_digest.get)


def test_a_version_hashed_again_is_stamped_and_stays_complete(tmp_path: Path) -> None:
    _, m, model = _assembled(tmp_path)
    assert VersionFiles(tmp_path).is_complete(m)  # hashed (no stamp yet), then stamped
    stamp = (model.parent / VERIFIED_FILE).read_text()
    assert stamp.startswith(m.sha256)
    assert VersionFiles(tmp_path).is_complete(m)  # a stamp this fresh is racy: hashed again
    assert (model.parent / VERIFIED_FILE).read_text() == stamp


def test_a_model_file_changed_in_place_with_its_mtime_put_back_is_not_complete(tmp_path: Path) -> None:
    _, m, model = _assembled(tmp_path)
    assert VersionFiles(tmp_path).is_complete(m)  # stamped
    stamp_file = model.parent / VERIFIED_FILE
    later = stamp_file.stat().st_mtime_ns + 10**10
    os.utime(stamp_file, ns=(later, later))  # as if stamped 10 s later: no longer racy, trusted
    time.sleep(0.05)  # past the clock tick of the stamp's ctime
    before = model.stat()
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))  # same size, same inode
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))  # ctime still moves
    assert not VersionFiles(tmp_path).is_complete(m)
