"""An edge given several central addresses (``--central a:1,b:2``) follows the first that
answers and moves to the next when its central goes away, registering again there."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from central.registry.signing import KEY_FILE
from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.zoo import build_mlp
from support.brokers import free_port
from support.fleet import central_settings, edge_settings, push, served_version
from support.metrics import metric_samples, sample
from support.wait import wait_for


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two different small ``mlp`` builds (``served_version`` sends 64 inputs)."""
    root = tmp_path_factory.mktemp("failover-models")
    return build_mlp(root / "a.onnx", width=64, hidden_layers=1), build_mlp(root / "b.onnx", width=64, hidden_layers=2)


async def _push(central: CentralServer, model: Path) -> None:
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        response = await push(api, "mlp", model)
    assert response.status_code == 201, response.text


async def _status(edge: EdgeServer) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=edge.http_url, timeout=10) as client:
        response = await client.get("/api/v1/status")
    assert response.status_code == 200, response.text
    central: dict[str, object] = response.json()["central"]
    return central


EdgeOnCentrals = Callable[[str, str], Awaitable[EdgeServer]]


@pytest.fixture
async def edge_on(tmp_path: Path) -> AsyncIterator[EdgeOnCentrals]:
    """Starts edges on a ``central`` list (``make_edge`` takes one central server); stops them after."""
    started: list[EdgeServer] = []

    async def start(node_id: str, central: str) -> EdgeServer:
        edge = EdgeServer(edge_settings(node_id, central, tmp_path / node_id))
        await edge.start()
        started.append(edge)
        return edge

    yield start
    for edge in started:
        await edge.stop()


class TwoCentrals:
    """Two started centrals; stops each once (``CentralServer.stop`` is not idempotent)."""

    def __init__(self, first: CentralServer, second: CentralServer) -> None:
        self.first, self.second = first, second
        self._running = [first, second]

    async def stop(self, server: CentralServer) -> None:
        self._running.remove(server)
        await server.stop()

    async def close(self) -> None:
        for server in list(self._running):
            await self.stop(server)


@pytest.fixture
async def two_centrals(tmp_path: Path) -> AsyncIterator[TwoCentrals]:
    """Two independent single-process centrals (own data dirs) that sign with one key, as
    the centrals of one fleet do: the edge pinned the first one's key."""
    first = CentralServer(central_settings(tmp_path / "c1"))
    await first.start()
    (tmp_path / "c2").mkdir()
    shutil.copy(tmp_path / "c1" / KEY_FILE, tmp_path / "c2" / KEY_FILE)
    second = CentralServer(central_settings(tmp_path / "c2"))
    await second.start()
    centrals = TwoCentrals(first, second)
    yield centrals
    await centrals.close()


async def test_an_edge_skips_a_dead_first_address_and_serves_from_the_second(
    central: CentralServer, edge_on: EdgeOnCentrals, models: tuple[Path, Path]
) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    await _push(central, models[0])
    edge = await edge_on("edge-0", f"{dead},{central.grpc_address}")
    await wait_for(lambda: _serves(edge, "1"), what="version 1 via the live central")
    assert await served_version(edge) == "1"
    assert await _status(edge) == {
        "address": central.grpc_address,
        "addresses": [dead, central.grpc_address],
        "switches": 1,
        "heartbeat_partition": None,
    }
    async with httpx.AsyncClient(base_url=edge.http_url, timeout=10) as client:
        metrics = metric_samples((await client.get("/metrics")).text)
    assert sample(metrics, "modelfleet_central_switches_total") == 1


async def test_an_edge_moves_to_the_next_central_when_its_central_stops(
    two_centrals: TwoCentrals, edge_on: EdgeOnCentrals, models: tuple[Path, Path]
) -> None:
    first, second = two_centrals.first, two_centrals.second
    for server in (first, second):
        await _push(server, models[0])
    edge = await edge_on("edge-0", f"{first.grpc_address},{second.grpc_address}")
    await wait_for(lambda: _serves(edge, "1"), what="version 1 via the first central")
    assert await served_version(edge) == "1"
    assert (await _status(edge))["address"] == first.grpc_address

    await two_centrals.stop(first)
    await wait_for(
        lambda: edge.edge.centrals.current == second.grpc_address and edge.edge.follower.connected.is_set(),
        what="the link to the second central",
    )
    assert await served_version(edge) == "1"  # kept serving across the move
    assert second.central.directory.get("edge-0") is not None, "registered again on the second"
    status = await _status(edge)
    assert status["address"] == second.grpc_address and status["switches"] == 1

    # the desired state now comes from the second: a version only it has reaches the edge
    await _push(second, models[1])
    await wait_for(lambda: _serves(edge, "2"), what="version 2 from the second central")
    assert await served_version(edge) == "2"


def _serves(edge: EdgeServer, version: str) -> bool:
    return any(m.version == version and str(m.state) == "ready" for m in edge.edge.repository.models())
