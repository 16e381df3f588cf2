"""The gateway's bound on requests it holds: beyond ``max_outstanding`` a request gets
503 with ``Retry-After`` and a JSON error before its body is read, and once the burst
is over the gateway forwards normally again (no slot leaks). Real edge, real uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import uvicorn
from fastapi import FastAPI

from central.gateway import Candidate, StaticNodeSource, create_gateway
from central.rest.gateway_routes import create_gateway_router
from central.server import CentralServer
from central.settings import GatewaySettings
from support.fleet import EdgeFactory, push
from support.wait import wait_for

REQUEST = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]}


async def _held_body(release: asyncio.Event) -> AsyncIterator[bytes]:
    body = orjson.dumps(REQUEST)
    yield body[:20]
    await release.wait()
    yield body[20:]


async def test_requests_beyond_max_outstanding_get_503_with_retry_after(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready on the edge")
    source = StaticNodeSource([Candidate(edge.node_id, f"127.0.0.1:{edge.http_port}")])
    proxy = create_gateway(source, GatewaySettings(max_outstanding=2))
    app = FastAPI()
    app.include_router(create_gateway_router(proxy))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, 10, "the gateway listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as gw:
            release = asyncio.Event()
            held = [asyncio.create_task(gw.post("/v2/models/tiny/infer", content=_held_body(release))) for _ in (1, 2)]
            await wait_for(lambda: proxy.outstanding == 2, 5, "two requests held by the gateway")

            refused = await gw.post("/v2/models/tiny/infer", json=REQUEST)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "1"
            assert "gateway.max_outstanding=2" in refused.json()["error"]
            assert proxy.stats.overloaded == 1 and proxy.stats.attempts == 0  # nothing reached the edge

            release.set()
            assert [(await r).status_code for r in held] == [200, 200]
            assert proxy.outstanding == 0
            for _ in range(3):  # after the burst: forwarded as usual
                ok = await gw.post("/v2/models/tiny/infer", json=REQUEST)
                assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [1, 10]
    finally:
        server.should_exit = True
        await serving
        await proxy.close()
