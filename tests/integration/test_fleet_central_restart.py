"""Edges keep what they hold while central is away, and resync when it returns."""

from __future__ import annotations

from pathlib import Path

import httpx

from central.server import CentralServer
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for


async def test_edges_resync_after_a_central_restart(make_edge: EdgeFactory, model_file: Path, tmp_path: Path) -> None:
    settings = central_settings(tmp_path / "central")
    first = CentralServer(settings)
    await first.start()
    edges = [await make_edge(f"edge-{i}", first) for i in range(2)]
    async with httpx.AsyncClient(base_url=first.http_url) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), what="rollout")
    await first.stop()
    await wait_for(lambda: not any(e.edge.follower.connected.is_set() for e in edges), what="edges noticing")
    assert all(version_state(e, "mlp", "1") == "complete" for e in edges)  # nothing lost meanwhile

    # Same data dir and ports: edges find it again by themselves.
    second = CentralServer(settings.model_copy(update={"grpc_port": first.grpc_port, "http_port": 0}))
    await second.start()
    try:
        await wait_for(lambda: len(second.central.directory.nodes()) == 2, 30, "edges re-registering")
        v2 = build_mlp(tmp_path / "v2.onnx", width=384, hidden_layers=4, head_seed=3)
        async with httpx.AsyncClient(base_url=second.http_url) as api:
            assert (await push(api, "mlp", v2)).status_code == 201
        await wait_for(lambda: all(version_state(e, "mlp", "2") == "complete" for e in edges), what="v2 rollout")
        for edge in edges:
            assert edge.edge.files.model_path("mlp", "2").read_bytes() == v2.read_bytes()
    finally:
        for edge in edges:
            await edge.stop()
        await second.stop()
