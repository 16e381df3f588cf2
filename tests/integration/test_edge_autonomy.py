"""Edges that outlive central and the broker: a node restarted while central is away serves
its last sealed desired state at once; a replayed older state (a rogue or stale "central") is
refused; with the broker down edges serve and fetch as usual and heartbeat again after."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx

from central.server import CentralServer
from edge_node.server import EdgeServer
from edge_node.sync.guard import STATE_FILE
from edge_node.sync.trust import PINNED_KEY_FILE
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, edge_settings, push, version_state
from support.wait import wait_for


async def _ready(edge: EdgeServer, model: str) -> bool:
    async with httpx.AsyncClient(base_url=edge.http_url) as api:
        return (await api.get(f"/v2/models/{model}/ready")).status_code == 200


async def _wait_ready(edge: EdgeServer, model: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await _ready(edge, model):
        assert asyncio.get_running_loop().time() < deadline, f"{model} not ready on {edge.node_id}"
        await asyncio.sleep(0.05)


async def test_an_edge_restarted_while_central_is_down_serves_its_last_versions_then_resyncs(
    make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    settings = central_settings(tmp_path / "central")
    central = CentralServer(settings)
    await central.start()
    edge = await make_edge("edge-0", central)
    async with httpx.AsyncClient(base_url=central.http_url) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
    await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", what="rollout")
    held = edge.edge.follower.state
    assert held is not None and edge.edge.status()["mode"] == "synced"
    await central.stop()
    await edge.stop()

    again = EdgeServer(edge_settings("edge-0", central.grpc_address, tmp_path / "edge-0"))
    await again.start()
    try:
        await _wait_ready(again, "mlp")
        status = again.edge.status()
        assert status["mode"] == "autonomous" and status["autonomous_since"] is not None
        assert status["generation"] == held.generation and not status["desired_state_refusals"]
        assert again.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()

        back = CentralServer(settings.model_copy(update={"grpc_port": central.grpc_port, "http_port": 0}))
        await back.start()
        try:
            await wait_for(lambda: again.edge.status()["mode"] == "synced", 20, "resync")
            assert again.edge.status()["generation"] > held.generation  # generations only grow
            assert await _ready(again, "mlp")
        finally:
            await back.stop()
    finally:
        await again.stop()


class _ReplayingCentral(registry_pb2_grpc.RegistryServicer):
    """Poses as central: answers Register with the real key and streams a recorded state."""

    def __init__(self, key: bytes, recorded: registry_pb2.DesiredState) -> None:
        self.key = key
        self.recorded = recorded
        self.watches = 0

    async def Register(
        self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RegisterReply:
        return registry_pb2.RegisterReply(accepted=True, manifest_public_key=self.key)

    async def WatchDesiredState(
        self, request: registry_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[registry_pb2.DesiredState]:
        self.watches += 1
        yield self.recorded
        await asyncio.sleep(3600)


async def test_an_older_sealed_state_replayed_by_a_rogue_central_is_refused(
    make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    central = CentralServer(central_settings(tmp_path / "central"))
    await central.start()
    edge = await make_edge("edge-0", central)
    data_dir = tmp_path / "edge-0"
    async with httpx.AsyncClient(base_url=central.http_url) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
        await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", what="v1")
        recorded = registry_pb2.DesiredState.FromString((data_dir / STATE_FILE).read_bytes())
        v2 = build_mlp(tmp_path / "v2.onnx", width=384, hidden_layers=4, head_seed=3)
        assert (await push(api, "mlp", v2)).status_code == 201
        await wait_for(lambda: version_state(edge, "mlp", "2") == "complete", what="v2")
    held = edge.edge.follower.state
    assert held is not None and held.generation > recorded.generation
    port = central.grpc_port
    await central.stop()

    rogue = _ReplayingCentral((data_dir / PINNED_KEY_FILE).read_bytes(), recorded)
    server = grpc.aio.server()
    registry_pb2_grpc.add_RegistryServicer_to_server(rogue, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        await wait_for(lambda: edge.edge.follower.refusals.get("generation", 0) >= 1, 20, "the replay refused")
        state = edge.edge.follower.state
        assert state is not None and state.generation == held.generation
        assert [v.manifest.key for v in state.versions if v.serve] == [("mlp", "2")]
        assert edge.edge.status()["mode"] == "autonomous"
        kept = registry_pb2.DesiredState.FromString((data_dir / STATE_FILE).read_bytes())
        assert kept.generation == held.generation
    finally:
        await server.stop(None)


async def test_with_the_broker_down_edges_fetch_and_serve_then_heartbeat_again(
    tmp_path: Path, mosquitto: MosquittoBroker, make_edge: EdgeFactory, model_file: Path
) -> None:
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    central = CentralServer(
        central_settings(tmp_path / "central", mqtt={"enabled": True, "default_interval_s": 0.3}, broker=broker)
    )
    await central.start()
    try:
        beats = {"heartbeat": {"enabled": True, "interval_s": 0.3}, "broker": broker}
        edges = [await make_edge(f"edge-{i}", central, **beats) for i in range(2)]
        await wait_for(lambda: all(e.edge.heartbeat.connected for e in edges), 20, "heartbeats")
        mosquitto.kill()
        await wait_for(lambda: not any(e.edge.heartbeat.connected for e in edges), 20, "broker gone")
        async with httpx.AsyncClient(base_url=central.http_url) as api:
            assert (await push(api, "mlp", model_file)).status_code == 201
        for edge in edges:
            await wait_for(lambda edge=edge: version_state(edge, "mlp", "1") == "complete", what="fetch")  # type: ignore[misc]
            await _wait_ready(edge, "mlp")
        sent = [e.edge.heartbeat.heartbeats_sent for e in edges]
        mosquitto.restart()
        await wait_for(
            lambda: all(e.edge.heartbeat.heartbeats_sent > n + 2 for e, n in zip(edges, sent, strict=True)),
            30,
            "heartbeats again",
        )
        names = {e.node_id for e in edges}
        alive = lambda: {v.node_id for v in central.central.liveness.nodes() if str(v.state) == "alive"}  # noqa: E731
        await wait_for(lambda: alive() == names, 30, "both alive at central")
    finally:
        await central.stop()


async def test_with_central_down_an_edge_fetches_a_known_version_from_its_peer(
    make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    """Central is down and one edge lost its files (not its sealed state): it gets the chunks
    of the version it knows from the peer the kept placement names."""
    central = CentralServer(central_settings(tmp_path / "central"))
    await central.start()
    edges = [await make_edge(f"edge-{i}", central) for i in range(2)]
    async with httpx.AsyncClient(base_url=central.http_url) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), what="rollout")
    await central.stop()
    lost = edges[1]
    await lost.stop()
    data_dir = tmp_path / lost.node_id
    shutil.rmtree(data_dir / "versions")
    shutil.rmtree(data_dir / "cache")

    again = EdgeServer(edge_settings(lost.node_id, central.grpc_address, data_dir))
    await again.start()
    try:
        await _wait_ready(again, "mlp", timeout=30)
        fetch = again.edge.fetcher.stats
        assert fetch.chunks_from_peers > 0 and fetch.chunks_from_origin == 0
        assert again.edge.files.model_path("mlp", "1").read_bytes() == model_file.read_bytes()
    finally:
        await again.stop()
