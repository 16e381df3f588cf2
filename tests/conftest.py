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
# machine (16 s instead of 2.5 s). Set before numpy is first imported (by ``brokers``).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import asyncio
import selectors
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from brokers import MosquittoBroker
from central.server import CentralServer
from central.settings import CentralSettings
from edge_node.server import EdgeServer
from edge_node.settings import EdgeSettings
from fleetwire.convert import manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.sealing import seal_state
from fleetwire.signing import sign_manifest
from fleetwire.v1 import registry_pb2
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo import build_mlp

#: Small chunks so that a few-MB test model has dozens of them.
SMALL_CHUNKS = {"avg_bytes": 64 * 1024, "min_bytes": 16 * 1024, "max_bytes": 256 * 1024}


def central_settings(data_dir: Path, **overrides: Any) -> CentralSettings:
    """Settings for a test central on free ports with small chunks.

    Quantization is off unless a test turns it on: distribution tests compare what edges
    hold with the uploaded bytes, and random test MLPs do not pass the INT8 guard."""
    base: dict[str, Any] = {
        "data_dir": data_dir,
        "http_port": 0,
        "grpc_port": 0,
        "chunking": SMALL_CHUNKS,
        "quantize": {"enabled": False},
        "mqtt": {"enabled": False},
    }
    base.update(overrides)
    return CentralSettings(**base)


def edge_settings(node_id: str, central: str, data_dir: Path, **overrides: Any) -> EdgeSettings:
    """Settings for a test edge on free ports with quick retries."""
    base: dict[str, Any] = {
        "node_id": node_id,
        "central": central,
        "data_dir": data_dir,
        "reconnect_backoff_max_s": 0.5,
        "heartbeat": {"enabled": False},
        "fetch": {"peer_timeout_s": 5.0, "origin_timeout_s": 20.0, "backoff_s": 0.05, "backoff_max_s": 0.5},
    }
    base.update(overrides)
    return EdgeSettings(**base)


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
async def api(central: CentralServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the central's REST API."""
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30.0) as client:
        yield client


EdgeFactory = Callable[..., Awaitable[EdgeServer]]


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


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def served_version(edge: EdgeServer) -> str:
    """The version of ``mlp`` (``build_mlp(width=64)``) that answers an inference request
    on the edge's HTTP API."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        response = await client.post("/v2/models/mlp/infer", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["model_version"])


async def wait_serving(edge: EdgeServer, name: str, version: str, timeout: float = 30.0) -> None:
    """Wait until the edge's HTTP API says ``name``/``version`` is ready to serve
    (``GET /v2/models/{name}/versions/{version}/ready``). Its files being ``complete``
    comes first; the session loads after, which takes seconds on a loaded machine."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=timeout) as client:
        while (await client.get(f"/v2/models/{name}/versions/{version}/ready")).status_code != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {name} {version} to serve")
            await asyncio.sleep(0.05)


def version_state(edge: EdgeServer, name: str, version: str) -> str | None:
    """The state an edge reports for one version, or None."""
    progress = edge.edge.materializer.progress.get((name, version))
    return progress.state if progress else None


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metric_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition: (name, labels) → value. Parsed with
    prometheus_client's own parser, so a malformed exposition fails the test."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0.0 when absent (a labelled counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def push(api: httpx.AsyncClient, name: str, path: Path, **params: str) -> httpx.Response:
    """Push a model file as a raw body."""
    return await api.post(f"/api/v1/models/{name}/versions", params=params, content=path.read_bytes())


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


# -- virtual time ------------------------------------------------------------------


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without waiting; when nothing is ready and the loop's next timer is due in
    ``timeout``, moves the loop's clock forward by that much instead of sleeping."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only I/O (a thread's call_soon_threadsafe) can wake it
            return super().select(None)
        ready = super().select(0)
        if not ready and timeout > 0:
            self._loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` moves only by jumping to its next timer: timers,
    ``asyncio.sleep`` and ``call_at`` deadlines behave as on a normal loop, but idle
    seconds take no wall time, and no CPU hiccup makes a callback late."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Tests marked ``virtual_time`` run on a ``VirtualTimeLoop``, every other one on
    asyncio's usual loop (pytest-asyncio asks for a factory for every async test)."""
    if item.get_closest_marker("virtual_time") is not None:
        return {"virtual_time": VirtualTimeLoop}
    return {"asyncio": asyncio.new_event_loop}


# -- desired-state seals ------------------------------------------------------------

#: The key ``sealed_state`` seals with by default.
SEAL_KEY = Ed25519PrivateKey.generate()


def sealed_state(
    generation: int = 7, node_id: str = "edge-1", key: Ed25519PrivateKey = SEAL_KEY, serve: bool = True
) -> registry_pb2.DesiredState:
    """A desired state of one signed manifest, sealed for ``node_id`` as central seals it."""
    manifest = Manifest(
        name="mlp",
        version="1",
        sha256="ab" * 32,
        size=4,
        chunks=[ChunkRef(digest="cd" * 32, size=4, offset=0)],
        created_at="2026-12-03T00:00:00Z",
    )
    state = registry_pb2.DesiredState(
        generation=generation,
        versions=[registry_pb2.VersionAssignment(manifest=manifest_to_pb(sign_manifest(manifest, key)), serve=serve)],
        limits=registry_pb2.TransferLimits(serve_bytes_per_s=1000),
        placement_enabled=True,
    )
    seal_state(state, node_id, 1_765_000_000_000, key.sign)
    return state


async def wait_rollout(
    api: httpx.AsyncClient,
    what: str,
    predicate: Callable[[dict[str, Any]], bool],
    model: str = "tiny",
    timeout: float = 40.0,
) -> dict[str, Any]:
    """Poll ``model``'s rollout (``GET /api/v1/models/{model}/rollout``) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        response = await api.get(f"/api/v1/models/{model}/rollout")
        assert response.status_code == 200, response.text
        rollout: dict[str, Any] = response.json()
        if predicate(rollout):
            return rollout
        if time.monotonic() > deadline:
            raise AssertionError(f"rollout never reached {what}: {rollout}")
        await asyncio.sleep(0.05)
