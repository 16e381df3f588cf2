"""A language-model version reaches an edge file by file: its folder on disk holds every file
of the push (graph, data, tokenizer, config, chat template) byte for byte. Serving it is the
generation engine's; until then the edge must not call it failed."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import httpx
import pytest

from central.server import CentralServer
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory, central_settings, version_state

PUSH = "/api/v1/models/{}/versions"


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.name != "manifest.json"
    }


@pytest.mark.parametrize("quantize", [False, True], ids=["fp32", "with-candidates"])
async def test_an_edge_assembles_every_file_of_a_language_model_and_does_not_fail_it(
    make_edge: EdgeFactory, tmp_path: Path, quantize: bool
) -> None:
    text = {"recipes": ["int4-b32"], "max_windows": 4}
    central = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": quantize, "text": text}))
    await central.start()
    try:
        async with httpx.AsyncClient(base_url=central.http_url, timeout=60) as api:
            await _assembled(central, api, make_edge, tmp_path)
    finally:
        await central.stop()


async def _assembled(central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path) -> None:
    folder = build_decoder(tmp_path / "tiny")
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    response = await api.post(PUSH.format("chat"), files=files)
    assert response.status_code == 201, response.text
    edge = await make_edge("e1", central)
    deadline = time.monotonic() + 30
    while version_state(edge, "chat", "1") not in ("complete", "failed") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # a load that would fail has had its chance
    assert version_state(edge, "chat", "1") == "complete", edge.edge.materializer.progress.get(("chat", "1"))
    # Which artifact an edge serves is its own choice (it times the candidates); each carries the
    # files. A served 4-bit one has FP32 beside it, the live shadow's reference.
    assembled = [m.parent for m in (edge.settings.data_dir / "versions" / "chat" / "1").glob("*/manifest.json")]
    assert assembled and len(assembled) <= 2 and (len(assembled) == 1 or "fp32" in {d.name for d in assembled})
    for directory in assembled:
        artifact = directory.name
        reference = {n: d for n, d in digests(folder).items() if artifact == "fp32" or not n.startswith("model.onnx")}
        assert {n: d for n, d in digests(directory).items() if n in reference} == reference
        assert set(digests(directory)) >= set(reference) - {"model.onnx.data"}
