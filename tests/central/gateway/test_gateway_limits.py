"""The gateway's bound on requests it holds: beyond ``max_outstanding`` a request gets
503 with ``Retry-After`` and a JSON error before its body is read, and once the burst
is over the gateway forwards normally again (no slot leaks). A place is taken only once a
body has arrived: requests whose bodies are still coming hold none. Real edge, real uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson

from central.gateway import StaticNodeSource, create_gateway
from central.server import CentralServer
from central.settings import GatewaySettings
from support.fleet import EdgeFactory, push
from support.gateway_harness import candidate, serve_gateway, silent_node
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
    source = StaticNodeSource([candidate(edge)])
    proxy = create_gateway(source, GatewaySettings(max_outstanding=2, model_timeouts={"tiny": 30}))
    async with serve_gateway(proxy) as gw:
        release = asyncio.Event()
        coming = [asyncio.create_task(gw.post("/v2/models/tiny/infer", content=_held_body(release))) for _ in (1, 2)]
        await asyncio.sleep(0.3)
        assert proxy.outstanding == 0  # two bodies still arriving hold no place
        assert (await gw.post("/v2/models/tiny/infer", json=REQUEST)).status_code == 200
        release.set()
        assert [(await r).status_code for r in coming] == [200, 200]

        async with silent_node() as silent:  # two whole requests held at a node that never answers
            source.set_model("tiny", [silent])
            held = [asyncio.create_task(gw.post("/v2/models/tiny/infer", json=REQUEST)) for _ in (1, 2)]
            await wait_for(lambda: proxy.outstanding == 2, 5, "two requests held by the gateway")
            refused = await gw.post("/v2/models/tiny/infer", json=REQUEST)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "1"
            assert "gateway.max_outstanding=2" in refused.json()["error"]
            assert proxy.stats.overloaded == 1
            source.set_model("tiny", None)
        assert all(r.status_code >= 500 for r in await asyncio.gather(*held))  # the silent node went away
        for _ in range(3):  # after the burst: forwarded as usual, no place leaked
            ok = await gw.post("/v2/models/tiny/infer", json=REQUEST)
            assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [1, 10]
        assert proxy.outstanding == 0
