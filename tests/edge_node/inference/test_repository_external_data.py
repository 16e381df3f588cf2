"""The repository loads an artifact from its assembled directory, external data beside the
graph, and never takes another model's optimized session from the cache because the two
share a graph file: the key covers the data files too."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_node.inference.repository import ModelRepository
from edge_node.inference.session import SessionFactory
from fleetwire.manifest import ChunkRef, FileRef, Manifest, TensorSpec
from support.external_data import DATA_FILE, build_external_mlp

CPU = ["CPUExecutionProvider"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_for(graph: Path, version: str) -> Manifest:
    data = graph.parent / DATA_FILE
    no_chunks: list[ChunkRef] = []
    return Manifest(
        name="m",
        version=version,
        sha256=_sha(graph),
        size=graph.stat().st_size,
        chunks=no_chunks,
        files=[FileRef(path=DATA_FILE, sha256=_sha(data), size=data.stat().st_size, chunks=no_chunks)],
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, 32])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 10])],
        created_at="2026-01-01T00:00:00Z",
    )


async def test_same_graph_other_weights_serve_their_own_outputs(tmp_path: Path) -> None:
    # <version>/<artifact>/model.onnx + model.onnx.data, as the edge assembles them.
    v1 = build_external_mlp(tmp_path / "versions" / "m" / "1" / "fp32", width=32, seed=1)
    v2 = build_external_mlp(tmp_path / "versions" / "m" / "2" / "fp32", width=32, seed=2)
    assert v1.read_bytes() == v2.read_bytes()  # the graphs are byte-identical; only the weights differ
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    repo = ModelRepository(SessionFactory(tmp_path / "opt", CPU), retire_grace_s=0.0)
    try:
        for graph, version in ((v1, "1"), (v2, "2")):
            await repo.load(manifest_for(graph, version), graph)
            model = repo.get("m", version)
            assert model.state == "ready", model.error
            expected = ort.InferenceSession(str(graph), providers=CPU).run(None, {"input": x})[0]
            got = (await model.infer({"input": x}))["logits"]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert len(list((tmp_path / "opt").glob("*.onnx"))) == 2  # one optimized model each
    finally:
        await repo.close()
