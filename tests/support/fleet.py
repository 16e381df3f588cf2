"""Settings and factories for real centrals and edges on loopback, and what tests ask of them
through their public surfaces (push a model, wait for an edge to serve, poll a rollout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from central.settings import CentralSettings
from edge_node.server import EdgeServer
from edge_node.settings import EdgeSettings

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


#: What the ``make_edge`` fixture returns: ``await make_edge(node_id, central, **settings)``.
EdgeFactory = Callable[..., Awaitable[EdgeServer]]


async def served_version(edge: EdgeServer, timeout: float = 30.0) -> str:
    """The version of ``mlp`` (``build_mlp(width=64)``) that answers an inference request
    on the edge's HTTP API. A 503 while the first version's session still loads (its files
    are ``complete`` before it serves; seconds on a loaded machine) is waited out; any other
    answer but 200 fails the test."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=timeout) as client:
        response = await client.post("/v2/models/mlp/infer", json=body)
        while response.status_code == 503 and "loading" in response.text and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
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


async def push(api: httpx.AsyncClient, name: str, path: Path, **params: str) -> httpx.Response:
    """Push a model file as a raw body."""
    return await api.post(f"/api/v1/models/{name}/versions", params=params, content=path.read_bytes())


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


async def events_of(api: httpx.AsyncClient, kind: str) -> list[dict[str, Any]]:
    """Central's kept fleet events of type ``kind`` (``GET /api/v1/events``), oldest first."""
    response = await api.get("/api/v1/events")
    assert response.status_code == 200, response.text
    body = response.json()
    events = body["events"] if isinstance(body, dict) else body
    return [e for e in events if e["type"] == kind]
