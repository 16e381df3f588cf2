"""A model with external data pushed as a tar.gz of its directory, served FP32 by a real
fleet: every edge assembles ``model.onnx`` and its data file from chunks and answers
exactly as ONNX Runtime does on the original; a restarted edge serves it again from disk
without fetching a byte, from its cached optimized session."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

from central.server import CentralServer
from support.external_data import DATA_FILE, build_external_mlp, infer_mlp, model_files, tar_of
from support.fleet import EdgeFactory, version_state
from support.wait import wait_for

WIDTH = 384


async def test_a_tar_pushed_model_with_external_data_is_served_by_every_edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    graph = build_external_mlp(tmp_path / "export", width=WIDTH, hidden_layers=3)
    edges = [await make_edge(f"edge-{i}", central, data_dir=tmp_path / f"edge-{i}") for i in range(2)]
    body = tar_of({f"export/{n}": d for n, d in model_files(graph).items()}, gz=True)
    pushed = await api.post("/api/v1/models/ext/versions", content=body, headers={"Content-Type": "application/gzip"})
    assert pushed.status_code == 201, pushed.text
    manifest = pushed.json()["manifest"]
    assert [f["path"] for f in manifest["files"]] == [DATA_FILE]

    await wait_for(lambda: all(e.edge.repository.ready() for e in edges), 60, "ext served on every edge")
    x = np.random.default_rng(2).standard_normal((5, WIDTH)).astype(np.float32)
    expected = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    data = (graph.parent / DATA_FILE).read_bytes()
    for edge in edges:
        assembled = edge.edge.files.model_path("ext", "1")
        assert assembled.parent.name == "fp32" and assembled.read_bytes() == graph.read_bytes()
        assert (assembled.parent / DATA_FILE).read_bytes() == data
        np.testing.assert_allclose(await infer_mlp(edge, x), expected, rtol=1e-5, atol=1e-6)
    # Each edge fetched the whole data file (from central or from its peer), not just the graph.
    peers = [e.edge.fetcher.stats.as_dict() for e in edges]
    assert sum(p["bytes_fetched"] for p in peers) >= 2 * len(data)

    await edges[0].stop()
    again = await make_edge("edge-0", central, data_dir=tmp_path / "edge-0")
    await wait_for(lambda: version_state(again, "ext", "1") == "complete", what="ext complete after the restart")
    await wait_for(lambda: again.edge.repository.ready(), what="ext served after the restart")
    assert again.edge.fetcher.stats.as_dict()["bytes_fetched"] == 0
    # ...and from ORT's optimized copy in its cache, data file and all (it used to be discarded).
    assert again.edge.repository.get("ext").cache_hit is True
    np.testing.assert_allclose(await infer_mlp(again, x), expected, rtol=1e-5, atol=1e-6)
    assert hashlib.sha256(data).hexdigest() == manifest["files"][0]["sha256"]
