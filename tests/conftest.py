"""Shared fixtures: real centrals and edges on loopback (port 0), models built by code."""

from __future__ import annotations

import os

# Tests spawn central and edge processes with Popen (preexec_fn: fork, then exec). With
# gRPC loaded here, its fork handlers restart the event-engine poller in the child, whose
# epoll fd close_fds has just closed: the child can abort with "epoll_wait error: Bad file
# descriptor" before it execs (grpc/grpc#43055). The test process never uses gRPC across
# a fork, so fork support is off, before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# One OpenBLAS thread per process (this one and every central, edge and bench child, which
# inherit it). A test run is many processes on few cores: OpenBLAS's busy-waiting pool, one
# thread per core in each, made training the digits MLP 6x slower on a loaded 2-core
# machine (16 s instead of 2.5 s). Set before numpy is first imported (by ``support.brokers``).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, edge_settings
from support.virtual_time import VirtualTimeLoop


def _require_fleet_marker(request: pytest.FixtureRequest) -> None:
    """Fail a test that starts a server outside the process without being marked ``fleet``
    (one that asks for the fixture with ``request.getfixturevalue``, which collection
    cannot see): ``make test-fast`` must never start one."""
    if request.node.get_closest_marker("fleet") is None:
        pytest.fail(f"{request.node.nodeid} starts a server: mark it (or its parameter) fleet", pytrace=False)


@pytest.fixture
def mosquitto(request: pytest.FixtureRequest) -> Iterator[MosquittoBroker]:
    """A private Mosquitto on a free loopback port, stopped after the test."""
    _require_fleet_marker(request)
    with MosquittoBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresInstance]:
    """A private PostgreSQL server (free loopback port, temp dir), once per session."""
    with PostgresInstance() as server:
        yield server


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, postgres: PostgresInstance) -> str:
    """The URL, password included, of a new empty database on the session's PostgreSQL."""
    _require_fleet_marker(request)
    return postgres.fresh_database()


@pytest.fixture
def ha_url(postgres_url: str) -> str:
    """``postgres_url`` with central's migrations applied (``ha_leader``, ``ha_partitions``,
    ``ha_replicas``…): what a replica's control session expects to find."""
    import psycopg

    from central.storage.postgres.migrate import apply_migrations

    with psycopg.connect(postgres_url) as conn:
        apply_migrations(conn)
    return postgres_url


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 server process on a free loopback port, one per session (a bucket per test)."""
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~2.7 MB float32 MLP (about 40 chunks of 64 KiB)."""
    return build_mlp(tmp_path_factory.mktemp("models") / "mlp.onnx", width=384, hidden_layers=4)


@pytest.fixture(scope="session")
def small_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny valid model for API tests."""
    return build_mlp(tmp_path_factory.mktemp("models") / "tiny.onnx", width=32, hidden_layers=1)


@pytest.fixture
async def central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """A started central with default test settings."""
    server = CentralServer(central_settings(tmp_path / "central"))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def fleet_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    """A started central hearing heartbeats on ``mosquitto``, its rollout controller on a 0.2 s tick."""
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    settings = central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, rollout={"interval_s": 0.2})
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(central: CentralServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the central's REST API."""
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30.0) as client:
        yield client


@pytest.fixture
async def make_edge(tmp_path: Path) -> AsyncIterator[EdgeFactory]:
    """Start edges against a central; all still running are stopped at the end."""
    started: list[EdgeServer] = []

    async def factory(node_id: str, central: CentralServer, **overrides: Any) -> EdgeServer:
        data_dir = overrides.pop("data_dir", tmp_path / node_id)
        edge = EdgeServer(edge_settings(node_id, central.grpc_address, data_dir, **overrides))
        await edge.start()
        started.append(edge)
        return edge

    yield factory
    for edge in started:
        if not getattr(edge, "_stopped", False):
            await edge.stop()


# -- markers (registered in pyproject.toml) ----------------------------------------

#: Folders (under ``tests/``) whose every test gets a marker: a fault or integration test
#: runs a fleet by definition, and ``tests/bench`` runs the benchmarks at tiny sizes.
_FOLDER_MARKERS = {"integration": "fleet", "faults": "fleet", "bench": "bench"}
#: Fixtures that start a server outside the test process: a test using one (directly or
#: through another fixture) is a ``fleet`` test. Files that start brokers, processes or
#: browsers without these say so with a ``pytestmark`` line.
_FLEET_FIXTURES = frozenset({"mosquitto", "postgres", "s3_server"})
_TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``fleet`` and ``bench`` tests by folder and fixture, so that
    ``-m "not fleet and not bench and not browser"`` (``make test-fast``) is the in-process subset."""
    for item in items:
        folder = item.path.relative_to(_TESTS).parts[0] if item.path.is_relative_to(_TESTS) else ""
        if folder in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[folder])
        if _FLEET_FIXTURES.intersection(item.fixturenames):
            item.add_marker("fleet")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Tests marked ``virtual_time`` run on a ``VirtualTimeLoop``, every other one on
    asyncio's usual loop (pytest-asyncio asks for a factory for every async test)."""
    if item.get_closest_marker("virtual_time") is not None:
        return {"virtual_time": VirtualTimeLoop}
    return {"asyncio": asyncio.new_event_loop}
