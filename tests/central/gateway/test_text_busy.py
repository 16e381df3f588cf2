"""A 429 from an edge (KV budget or queue full) is tried on another node or passed on with
its Retry-After, and never counts against the node's breaker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn
from fastapi import FastAPI

from central.gateway import Candidate, GatewayRouter, StaticNodeSource
from central.gateway.proxy import GatewayProxy
from central.gateway.text_proxy import TextGateway
from central.gateway.text_routing import GenerationLoads, TextRouting
from central.rest.text_routes import create_text_router

_BODY = b'{"error": {"message": "KV budget full", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}'
BUSY = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 7\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


@contextlib.asynccontextmanager
async def busy_node(node_id: str) -> AsyncIterator[Candidate]:
    """A node that answers every request 429 with Retry-After: 7."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await reader.read(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += await reader.read(65536)
        writer.write(BUSY)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield Candidate(node_id, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def serve_text(nodes: list[Candidate]) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayProxy]]:
    proxy = GatewayProxy(GatewayRouter(StaticNodeSource(nodes)))
    text = TextGateway(proxy, TextRouting(proxy.router, GenerationLoads()))
    app = FastAPI()
    app.include_router(create_text_router(proxy, text))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as client:
            yield client, proxy
    finally:
        server.should_exit = True
        await task
        await proxy.close()


async def test_every_node_busy_passes_the_429_on_and_no_breaker_counts_it() -> None:
    async with busy_node("b0") as b0, busy_node("b1") as b1, serve_text([b0, b1]) as (client, proxy):
        for stream in (False, True):
            for _ in range(4):  # more than the breaker's threshold of 3
                body = {"model": "chat", "prompt": "hi", "stream": stream}
                answer = await client.post("/v1/completions", json=body)
                assert answer.status_code == 429 and answer.headers["retry-after"] == "7", answer.text
        assert proxy.stats.busy == 16 and proxy.stats.node_failures == 0
        for node in ("b0", "b1"):
            assert proxy.router.breaker(node).snapshot()["state"] == "closed"
            assert proxy.router.breaker(node).consecutive_failures == 0
