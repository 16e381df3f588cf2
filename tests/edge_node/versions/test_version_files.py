"""VersionFiles: every file of an artifact assembled into ``<version>/<artifact>/``, each
whole or absent, the marker last; a changed file is noticed; the layout before artifact
directories is moved in place when an upgraded edge opens its data directory; a reopened
store (a warm start) reads only files whose stat moved since they were verified."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_node.versions import VersionFiles
from edge_node.versions.store import MANIFEST_FILE, AssemblyError
from edge_node.versions.verified import RECORD_FILE, VerificationStats
from fleetwire.manifest import ArtifactRef, ChunkRef, FileRef, Manifest, TensorSpec
from modelfleet.zoo import build_mlp
from support.external_data import DATA_FILE, build_external_mlp

PIECE = 4096


def cut(data: bytes, chunks: dict[str, bytes]) -> list[ChunkRef]:
    """Fixed-size chunks of ``data``, added to ``chunks`` by digest."""
    refs = []
    for start in range(0, len(data), PIECE):
        piece = data[start : start + PIECE]
        digest = hashlib.sha256(piece).hexdigest()
        chunks[digest] = piece
        refs.append(ChunkRef(digest=digest, size=len(piece)))
    return refs


def artifact_of(name: str, graph: Path, chunks: dict[str, bytes]) -> ArtifactRef:
    """An artifact made of ``graph`` and every file next to it."""
    data = graph.read_bytes()
    files = [
        FileRef(path=p.name, sha256=hashlib.sha256(p.read_bytes()).hexdigest(), size=p.stat().st_size,
                chunks=cut(p.read_bytes(), chunks))
        for p in sorted(graph.parent.iterdir()) if p != graph
    ]  # fmt: skip
    return ArtifactRef(
        artifact=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data), chunks=cut(data, chunks), files=files
    )


def manifest_of(served: ArtifactRef, *alternatives: ArtifactRef, version: str = "1") -> Manifest:
    return Manifest(
        name="m",
        version=version,
        sha256=served.sha256,
        size=served.size,
        chunks=served.chunks,
        files=served.files,
        artifact=served.artifact,
        alternatives=list(alternatives),
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, 16])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 10])],
        created_at="2026-01-01T00:00:00Z",
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Manifest, dict[str, bytes], Path]:
    """A version served as an external-data artifact ``int8`` with a single-file ``fp32`` alternative."""
    chunks: dict[str, bytes] = {}
    external = build_external_mlp(tmp_path / "int8-src", width=16, hidden_layers=2)
    single = build_mlp(tmp_path / "fp32-src" / "model.onnx", width=16, hidden_layers=1)
    manifest = manifest_of(artifact_of("int8", external, chunks), artifact_of("fp32", single, chunks))
    return manifest, chunks, external


def test_an_external_data_artifact_is_assembled_into_its_directory_and_loads(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path]
) -> None:
    manifest, chunks, source = setup
    files = VersionFiles(tmp_path / "versions")
    path = files.assemble(manifest, chunks.get)
    directory = tmp_path / "versions" / "m" / "1" / "int8"
    assert path == directory / "model.onnx" == files.model_path("m", "1")
    assert sorted(p.name for p in directory.iterdir()) == sorted([DATA_FILE, MANIFEST_FILE, RECORD_FILE, "model.onnx"])
    assert (directory / DATA_FILE).read_bytes() == (source.parent / DATA_FILE).read_bytes()
    assert files.is_complete(manifest) and not files.is_complete(manifest, "fp32")

    x = np.ones((2, 16), dtype=np.float32)
    expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    np.testing.assert_array_equal(expected[0], got[0])

    # Another artifact of the same version goes beside it.
    fp32 = files.assemble(manifest, chunks.get, "fp32")
    assert fp32 == tmp_path / "versions" / "m" / "1" / "fp32" / "model.onnx"
    assert files.is_complete(manifest, "fp32") and files.is_complete(manifest, "int8")


def _failing_on(digest: str, chunks: dict[str, bytes], error: Exception | None) -> Callable[[str], bytes | None]:
    def read(d: str) -> bytes | None:
        if d == digest:
            if error is not None:
                raise error
            return None
        return chunks[d]

    return read


@pytest.mark.parametrize("error", [None, OSError(28, "No space left on device")], ids=["chunk gone", "disk full"])
def test_a_failed_assembly_leaves_no_half_file_and_no_marker(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path], error: Exception | None
) -> None:
    manifest, chunks, _ = setup
    files = VersionFiles(tmp_path / "versions")
    last = manifest.files[0].chunks[-1].digest  # the data file fails at its very end
    with pytest.raises(AssemblyError if error is None else OSError):
        files.assemble(manifest, _failing_on(last, chunks, error))
    directory = tmp_path / "versions" / "m" / "1" / "int8"
    left = sorted(p.name for p in directory.iterdir())
    assert MANIFEST_FILE not in left and DATA_FILE not in left and not [n for n in left if n.startswith(".")]
    assert not files.is_complete(manifest)
    files.assemble(manifest, chunks.get)  # the retry completes
    assert files.is_complete(manifest)


def test_a_data_file_changed_on_disk_makes_the_artifact_incomplete(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path]
) -> None:
    manifest, chunks, _ = setup
    files = VersionFiles(tmp_path / "versions")
    files.assemble(manifest, chunks.get)
    data = tmp_path / "versions" / "m" / "1" / "int8" / DATA_FILE
    tampered = bytearray(data.read_bytes())
    tampered[100] ^= 0xFF
    data.write_bytes(bytes(tampered))
    assert not files.is_complete(manifest)
    assert files.latest_complete("m", exclude="2") is None
    files.assemble(manifest, chunks.get)
    assert files.is_complete(manifest) and files.latest_complete("m", exclude="2") == manifest


def test_temp_files_of_a_killed_assembly_are_removed_on_open(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path]
) -> None:
    manifest, chunks, _ = setup
    VersionFiles(tmp_path / "versions").assemble(manifest, chunks.get)
    stale = [tmp_path / "versions" / "m" / "1" / "int8" / name for name in (".assemble-x1", ".verified-x2")]
    for path in stale:
        path.write_bytes(b"half")
    VersionFiles(tmp_path / "versions")
    assert not any(path.exists() for path in stale)


def test_an_edge_upgraded_in_place_finds_its_versions_in_the_old_layout(tmp_path: Path) -> None:
    chunks: dict[str, bytes] = {}
    model = build_mlp(tmp_path / "src" / "model.onnx", width=16, hidden_layers=1)
    manifest = manifest_of(artifact_of("int8", model, chunks))
    old = tmp_path / "versions" / "m" / "1"  # <version>/model.onnx + manifest.json, as edges wrote them before
    old.mkdir(parents=True)
    (old / "model.onnx").write_bytes(model.read_bytes())
    (old / MANIFEST_FILE).write_text(manifest.model_dump_json())
    half = tmp_path / "versions" / "m" / "2"  # a version whose assembly never finished
    half.mkdir()
    (half / ".assemble-abc").write_bytes(b"x")

    files = VersionFiles(tmp_path / "versions")
    assert files.is_complete(manifest)  # served again without a byte fetched
    assert files.model_path("m", "1") == old / "int8" / "model.onnx"
    assert sorted(p.name for p in old.iterdir()) == ["int8"]
    assert files.latest_complete("m", exclude="2") == manifest
    assert list(half.iterdir()) == []
    assert json.loads((old / "int8" / MANIFEST_FILE).read_text())["sha256"] == manifest.sha256


# -- verified records: a warm start reads no unchanged file ------------------------------


def _total(manifest: Manifest) -> int:
    return manifest.size + sum(f.size for f in manifest.files)


def test_a_reopened_store_trusts_its_record_and_reads_no_unchanged_file(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path]
) -> None:
    manifest, chunks, _ = setup
    VersionFiles(tmp_path / "versions").assemble(manifest, chunks.get)
    assert (tmp_path / "versions" / "m" / "1" / "int8" / RECORD_FILE).is_file()

    warm = VersionFiles(tmp_path / "versions")  # a restart
    assert warm.is_complete(manifest) and warm.latest_complete("m", exclude="2") == manifest
    stats = warm.verification.as_dict()
    assert stats["files_rehashed"] == stats["bytes_rehashed"] == 0
    assert stats["files_trusted"] == 4 and stats["bytes_trusted"] == 2 * _total(manifest)

    full = VersionFiles(tmp_path / "versions", rehash_all=True)  # what every start did before records
    assert full.is_complete(manifest)
    assert full.verification.as_dict() == {**VerificationStats().as_dict(), "files_rehashed": 2,
                                           "bytes_rehashed": _total(manifest)}  # fmt: skip


def _flip_in_place(path: Path, offset: int, restore_mtime: bool) -> None:
    """Flip one byte without changing the size or the inode; optionally put atime and mtime back."""
    before = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    if restore_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)
    assert (after.st_mtime_ns == before.st_mtime_ns) is restore_mtime


@pytest.mark.parametrize("restore_mtime", [False, True], ids=["size kept", "size and mtime kept"])
def test_a_byte_changed_while_the_edge_was_down_is_caught_at_the_next_start(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path], restore_mtime: bool
) -> None:
    manifest, chunks, _ = setup
    VersionFiles(tmp_path / "versions").assemble(manifest, chunks.get)
    data = tmp_path / "versions" / "m" / "1" / "int8" / DATA_FILE
    _flip_in_place(data, 100, restore_mtime)

    warm = VersionFiles(tmp_path / "versions")
    assert not warm.is_complete(manifest)
    stats = warm.verification.as_dict()  # the graph, unchanged, is trusted; the data file is read
    assert (stats["files_trusted"], stats["files_rehashed"], stats["files_mismatched"]) == (1, 1, 1)
    assert warm.latest_complete("m", exclude="2") is None
    warm.assemble(manifest, chunks.get)
    assert hashlib.sha256(data.read_bytes()).hexdigest() == manifest.files[0].sha256
    again = VersionFiles(tmp_path / "versions")
    assert again.is_complete(manifest) and again.verification.files_rehashed == 0


def _record(tmp_path: Path) -> Path:
    return tmp_path / "versions" / "m" / "1" / "int8" / RECORD_FILE


@pytest.mark.parametrize("lie", ["garbage", "another digest", "another inode", "as new as the record"])
def test_a_record_that_does_not_hold_costs_a_rehash_and_is_renewed(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path], lie: str
) -> None:
    manifest, chunks, _ = setup
    VersionFiles(tmp_path / "versions").assemble(manifest, chunks.get)
    record = _record(tmp_path)
    doc = json.loads(record.read_text())
    if lie == "garbage":
        record.write_text('{"format": 1, "files": {"model.onnx": {"sha256": 1}}')
    elif lie in ("another digest", "another inode"):
        for entry in doc["files"].values():
            entry["sha256" if lie == "another digest" else "ino"] = "0" * 64 if lie == "another digest" else 1
        record.write_text(json.dumps(doc))
    else:  # a coarse-timestamp file system: the record no newer than the files it vouches for
        os.utime(record, ns=(0, 0))

    warm = VersionFiles(tmp_path / "versions")
    assert warm.is_complete(manifest)  # the files are whole: read again, found right
    assert warm.verification.files_trusted == 0 and warm.verification.files_rehashed == 2
    again = VersionFiles(tmp_path / "versions")
    assert again.is_complete(manifest) and again.verification.files_trusted == 2


def test_bytes_changed_under_an_unchanged_stat_are_caught_only_by_rehash_all(
    tmp_path: Path, setup: tuple[Manifest, dict[str, bytes], Path]
) -> None:
    """The residual risk, stated: a change the stat does not show (bit rot, a raw write to the
    device; here a record rewritten to vouch for the changed file) passes the record check."""
    manifest, chunks, _ = setup
    VersionFiles(tmp_path / "versions").assemble(manifest, chunks.get)
    data = tmp_path / "versions" / "m" / "1" / "int8" / DATA_FILE
    _flip_in_place(data, 100, restore_mtime=True)
    record = _record(tmp_path)
    doc = json.loads(record.read_text())
    st = data.stat()
    doc["files"][DATA_FILE].update(mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino)
    record.write_text(json.dumps(doc))

    assert VersionFiles(tmp_path / "versions").is_complete(manifest)  # trusted: the documented limit
    full = VersionFiles(tmp_path / "versions", rehash_all=True)
    assert not full.is_complete(manifest) and full.verification.files_mismatched == 1
