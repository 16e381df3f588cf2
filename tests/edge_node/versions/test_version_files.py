"""VersionFiles: every file of an artifact assembled into ``<version>/<artifact>/``, each
whole or absent, the marker last; a changed file is noticed; the layout before artifact
directories is moved in place when an upgraded edge opens its data directory."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_node.versions import VersionFiles
from edge_node.versions.store import MANIFEST_FILE, AssemblyError
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
    assert sorted(p.name for p in directory.iterdir()) == sorted([DATA_FILE, MANIFEST_FILE, "model.onnx"])
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
    stale = tmp_path / "versions" / "m" / "1" / "int8" / ".assemble-x1"
    stale.write_bytes(b"half")
    VersionFiles(tmp_path / "versions")
    assert not stale.exists()


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
