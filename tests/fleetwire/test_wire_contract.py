"""The shared wire contract: names, digests, manifest conversion, generated stubs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetwire import ChunkRef, InvalidName, Manifest, TensorSpec, check_name, chunk_digest, is_digest
from fleetwire.convert import manifest_from_pb, manifest_to_pb

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["mlp", "resnet-50", "v1.2.3", "A_b", "x" * 128])
def test_valid_names(value: str) -> None:
    assert check_name("model name", value) == value


@pytest.mark.parametrize("value", ["", "a/b", "a\\b", "..", "a..b", ".hidden", "x" * 129, "sp ace", "ü"])
def test_invalid_names_say_why(value: str) -> None:
    with pytest.raises(InvalidName, match="model name"):
        check_name("model name", value)


def test_digest_helpers() -> None:
    d = chunk_digest(b"abc")
    assert d == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert is_digest(d) and not is_digest(d.upper()) and not is_digest(d[:-1])


def test_manifest_survives_the_protobuf_round_trip() -> None:
    m = Manifest(
        name="mlp",
        version="3",
        sha256="a" * 64,
        size=30,
        chunks=[
            ChunkRef(digest="b" * 64, size=10),
            ChunkRef(digest="c" * 64, size=20),
            ChunkRef(digest="b" * 64, size=10),
        ],
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, 8])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 10])],
        created_at="2026-12-02T00:00:00.000Z",
        labels={"team": "vision"},
    )
    assert manifest_from_pb(manifest_to_pb(m)) == m
    assert [c.digest for c in m.unique_chunks()] == ["b" * 64, "c" * 64]


def test_generated_stubs_match_the_proto_sources() -> None:
    result = subprocess.run(["bash", "scripts/check_proto.sh"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
