"""A real edge restarted on its data dir: a model file changed in place while it was down
(one byte, size kept, even mtime put back) is caught at the next start and rebuilt from the
cache before anything is served; an unchanged model is not read at all on a warm start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.external_data import DATA_FILE, build_external_mlp, infer_mlp, model_files, tar_of
from support.fleet import EdgeFactory, version_state
from support.wait import wait_for

WIDTH = 64


async def _status(edge: EdgeServer) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        answer = await client.get("/api/v1/status")
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


async def _serving(make_edge: EdgeFactory, central: CentralServer, data_dir: Path) -> EdgeServer:
    edge = await make_edge("edge-0", central, data_dir=data_dir, fetch={"hot_cache_bytes": 0})
    await wait_for(lambda: version_state(edge, "ext", "1") == "complete", what="ext complete")
    await wait_for(lambda: edge.edge.repository.ready(), what="ext served")
    return edge


def _flip_in_place(path: Path, restore_mtime: bool) -> None:
    """One byte in the middle of ``path`` flipped through the same inode, size kept."""
    before = path.stat()
    with path.open("r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)[0]
        f.seek(before.st_size // 2)
        f.write(bytes([byte ^ 0xFF]))
    if restore_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino, after.st_mtime_ns == before.st_mtime_ns) == (
        before.st_size, before.st_ino, restore_mtime,
    )  # fmt: skip


@pytest.mark.parametrize("restore_mtime", [False, True], ids=["size kept", "size and mtime kept"])
async def test_a_model_file_changed_while_the_edge_was_down_is_rebuilt_before_it_is_served(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path, restore_mtime: bool
) -> None:
    graph = build_external_mlp(tmp_path / "export", width=WIDTH, hidden_layers=2)
    body = tar_of({f"export/{n}": d for n, d in model_files(graph).items()}, gz=True)
    pushed = await api.post("/api/v1/models/ext/versions", content=body, headers={"Content-Type": "application/gzip"})
    assert pushed.status_code == 201, pushed.text
    published = (graph.parent / DATA_FILE).read_bytes()
    x = np.random.default_rng(3).standard_normal((4, WIDTH)).astype(np.float32)
    expected = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]

    edge = await _serving(make_edge, central, tmp_path / "edge-0")
    data = edge.edge.files.model_path("ext", "1").parent / DATA_FILE
    await edge.stop()
    _flip_in_place(data, restore_mtime)

    again = await _serving(make_edge, central, tmp_path / "edge-0")
    assert data.read_bytes() == published  # rebuilt from the cache before it was loaded
    np.testing.assert_allclose(await infer_mlp(again, x), expected, rtol=1e-5, atol=1e-6)
    status = await _status(again)
    assert status["fetch"]["bytes_fetched"] == 0
    checked = status["verification"]
    assert (checked["files_mismatched"], checked["files_rehashed"], checked["files_trusted"]) == (1, 1, 1)
    await again.stop()

    # Nothing changed since: a warm start reads none of the model.
    third = await _serving(make_edge, central, tmp_path / "edge-0")
    checked = (await _status(third))["verification"]
    assert checked["files_rehashed"] == checked["bytes_rehashed"] == 0 and checked["files_trusted"] == 2
    assert checked["bytes_trusted"] == len(published) + graph.stat().st_size
    np.testing.assert_allclose(await infer_mlp(third, x), expected, rtol=1e-5, atol=1e-6)
