"""The raw ASGI inference fast path answers exactly as the FastAPI routes it stands in
front of (same statuses, headers and bodies), leaves every other request to FastAPI, keeps
the inference routes in the OpenAPI document, and survives a client that leaves mid-body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn

from central.server import CentralServer
from edge_node.rest.app import create_app
from edge_node.server import EdgeServer
from support.fleet import EdgeFactory, push
from support.wait import wait_for

ROW = [0.25] * 32
JSON_REQUEST = {"id": "r1", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": ROW}]}
BINARY_OUT = {**JSON_REQUEST, "parameters": {"binary_data_output": True}}


def _binary_request() -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "parameters": {"binary_data_size": 128}}]}
    )
    return header + b"\0" * 128, {"Inference-Header-Content-Length": str(len(header))}


#: (path, body, headers): every one answered by the fast path on the edge.
CASES: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v2/models/tiny/infer", orjson.dumps(JSON_REQUEST), {}),
    ("/v2/models/tiny/versions/v1/infer", orjson.dumps(JSON_REQUEST), {}),
    ("/v2/models/tiny/infer", orjson.dumps(BINARY_OUT), {}),
    ("/v2/models/tiny/infer", *_binary_request()),
    ("/v2/models/tiny/infer", b"{not json", {}),
    ("/v2/models/tiny/infer", orjson.dumps(JSON_REQUEST), {"Inference-Header-Content-Length": "x"}),
    ("/v2/models/tiny/infer", orjson.dumps(JSON_REQUEST), {"Inference-Header-Content-Length": "99999"}),
    ("/v2/models/nope/infer", orjson.dumps(JSON_REQUEST), {}),
    ("/v2/models/tiny/versions/v9/infer", orjson.dumps(JSON_REQUEST), {}),
    ("/v2/models/Bad%20Name/infer", orjson.dumps(JSON_REQUEST), {}),
    ("/v2/models/tiny/infer", b" " * 5000, {}),  # over the body cap
]


@pytest.fixture
async def edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> EdgeServer:
    server = await make_edge(
        "edge-0", central, limits={"max_infer_body_bytes": 4096}, inference={"bench_endpoints": True}
    )
    assert (await push(api, "tiny", small_model_file, version="v1")).status_code == 201
    await wait_for(lambda: server.edge.repository.ready(), what="tiny ready on the edge")
    return server


@pytest.fixture
async def fastapi_url(edge: EdgeServer) -> AsyncIterator[str]:
    """The same plane served by the FastAPI app alone (no fast path), on its own port."""
    app = create_app(edge.edge.plane, edge.edge.status).fastapi
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started, 10, "the FastAPI-only server")
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    await task


def _answer(response: httpx.Response) -> tuple[int, str, str | None, bytes]:
    headers = response.headers
    return (
        response.status_code,
        headers["content-type"],
        headers.get("inference-header-content-length"),
        response.content,
    )


async def test_the_fast_path_answers_as_the_fastapi_routes_do(edge: EdgeServer, fastapi_url: str) -> None:
    async with (
        httpx.AsyncClient(base_url=edge.http_url, timeout=30) as fast,
        httpx.AsyncClient(base_url=fastapi_url, timeout=30) as slow,
    ):
        statuses = []
        for path, body, headers in CASES:
            got, want = (
                await fast.post(path, content=body, headers=headers),
                await slow.post(path, content=body, headers=headers),
            )
            assert _answer(got) == _answer(want), path
            assert int(got.headers["content-length"]) == len(got.content)
            statuses.append(got.status_code)
        assert statuses == [200, 200, 200, 200, 400, 400, 400, 404, 404, 422, 413]
        assert (await fast.post("/bench/noop", content=orjson.dumps(JSON_REQUEST))).content == b'{"outputs":[]}'


async def test_other_requests_reach_fastapi_and_the_document_keeps_the_infer_routes(edge: EdgeServer) -> None:
    async with httpx.AsyncClient(base_url=edge.http_url, timeout=30) as oip:
        paths = (await oip.get("/openapi.json")).json()["paths"]
        assert "post" in paths["/v2/models/{name}/infer"] and "post" in paths["/v2/models/{name}/versions/{v}/infer"]
        assert (await oip.get("/v2/models/tiny/infer")).status_code == 405
        assert (await oip.get("/healthz")).json() == {"status": "ok"}
        assert (await oip.post("/v2/models//infer", json=JSON_REQUEST)).status_code == 404


async def test_a_client_leaving_mid_body_holds_no_slot(edge: EdgeServer) -> None:
    host, port = "127.0.0.1", edge.http_port
    _reader, writer = await asyncio.open_connection(host, port)
    writer.write(b'POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"inputs"')
    await writer.drain()
    await asyncio.sleep(0.2)
    assert edge.edge.plane.inflight == 0  # a body still arriving takes no place
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.2)
    assert edge.edge.plane.inflight == 0
    async with httpx.AsyncClient(base_url=edge.http_url, timeout=30) as oip:
        assert (await oip.post("/v2/models/tiny/infer", json=JSON_REQUEST)).status_code == 200
