"""ChunkStep and ManifestStep on a push with several artifacts, each with external data:
every file of every artifact is chunked; the served manifest carries the other artifacts
as alternatives (FP32 always), each with its own files and the quantize step's report; the
per-artifact manifests stay single-artifact; the signature covers all of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.registry.chunker import Chunker
from central.registry.pipeline import ChunkStep, ManifestStep, PushContext
from central.registry.signing import ManifestSigner
from central.settings import ChunkingSettings
from central.storage.blobs.local import BlobStore
from fleetwire.signing import SignatureError, raw_public_key, verify_manifest
from support.external_data import DATA_FILE, build_external_mlp
from support.fleet import SMALL_CHUNKS


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def ctx(tmp_path: Path) -> PushContext:
    fp32 = build_external_mlp(tmp_path / "upload", width=128, seed=1)
    work = tmp_path / "work"
    # Two artifacts in one work directory, each graph naming its own data file.
    int8 = build_external_mlp(work, width=128, seed=2, graph="int8.onnx", location="int8.onnx.data")
    other = build_external_mlp(work, width=128, seed=3, graph="u8s8.onnx", location="u8s8.onnx.data")
    context = PushContext("m", "1", {}, fp32, _sha(fp32), fp32.stat().st_size, staged_files=[DATA_FILE])
    context.artifacts = {"fp32": fp32, "int8": int8, "int8-u8s8": other}
    context.served_artifact = "int8"
    context.alternatives = ["int8-u8s8"]
    context.quantization = {"served": "int8"}
    context.artifact_reports = {"int8": {"recipe": "s8s8"}, "int8-u8s8": {"recipe": "u8s8", "agreement": 0.995}}
    return context


def test_every_file_of_every_artifact_is_chunked_and_offered(tmp_path: Path, ctx: PushContext) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    key = Ed25519PrivateKey.generate()
    ChunkStep(Chunker(ChunkingSettings(**SMALL_CHUNKS)), blobs).run(ctx)
    ManifestStep(ManifestSigner(key)).run(ctx)
    served = ctx.manifest
    assert served is not None and served.artifact == "int8"
    assert [f.path for f in served.files] == ["int8.onnx.data"]
    assert [a.artifact for a in served.alternatives] == ["int8-u8s8", "fp32"]  # the quantize step's, then FP32
    by_name = {a.artifact: a for a in served.artifacts()}
    # the served one: the push's report, as before, with every artifact's IR version and opsets
    fmt = {"ir_version": 9, "opsets": {"": 17}}
    assert by_name["int8"].quantization == {"served": "int8", "formats": dict.fromkeys(ctx.artifacts, fmt)}
    assert by_name["int8-u8s8"].quantization == {"recipe": "u8s8", "agreement": 0.995}
    assert by_name["fp32"].quantization is None
    for name, graph in ctx.artifacts.items():
        artifact = by_name[name]
        (data,) = artifact.files
        assert artifact.sha256 == _sha(graph) and data.sha256 == _sha(graph.parent / data.path)
        rebuilt = b"".join(blobs.read(c.digest) for c in data.chunks)
        assert rebuilt == (graph.parent / data.path).read_bytes()
    assert {c.digest for c in served.unique_chunks()} <= {p.name for p in blobs.root.glob("*/*")}

    # The per-artifact manifests the store keeps: one artifact each, with its files.
    assert set(ctx.manifests) == {"fp32", "int8", "int8-u8s8"}
    assert ctx.manifests["fp32"].alternatives == [] and [f.path for f in ctx.manifests["fp32"].files] == [DATA_FILE]
    assert ctx.manifests["fp32"].quantization == {"served": "int8"}  # the formats: in the served one only

    verify_manifest(served, raw_public_key(key))
    forged = served.model_copy(update={"alternatives": served.alternatives[:1]})
    with pytest.raises(SignatureError):
        verify_manifest(forged, raw_public_key(key))


def test_fp32_served_offers_only_what_the_quantize_step_chose(tmp_path: Path, ctx: PushContext) -> None:
    ctx.served_artifact, ctx.alternatives = "fp32", ["int8", "fp32", "never-stored"]
    ChunkStep(Chunker(ChunkingSettings(**SMALL_CHUNKS)), BlobStore(tmp_path / "blobs")).run(ctx)
    ManifestStep().run(ctx)
    assert ctx.manifest is not None and ctx.manifest.artifact == "fp32"
    assert [a.artifact for a in ctx.manifest.alternatives] == ["int8"]
    assert ctx.report["files"] == 2 and ctx.report["total_bytes"] == ctx.manifest.served().total_size
