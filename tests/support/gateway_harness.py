"""The gateway's routes on a real uvicorn (port 0) in front of real edges, for the tests
of this folder."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn
from fastapi import FastAPI

from central.gateway import Candidate, GatewayProxy
from central.rest.gateway_routes import create_gateway_router
from edge_node.server import EdgeServer


@contextlib.asynccontextmanager
async def silent_node(node_id: str = "silent") -> AsyncIterator[Candidate]:
    """A node that takes every request whole and never answers: the gateway holds each
    request sent there (its body arrived) until the block ends and the connections close."""
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Candidate(node_id, f"127.0.0.1:{port}")
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


def candidate(edge: EdgeServer) -> Candidate:
    """The gateway's view of a started edge."""
    return Candidate(edge.node_id, f"127.0.0.1:{edge.http_port}")


@contextlib.asynccontextmanager
async def serve_gateway(proxy: GatewayProxy) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's routes on a real uvicorn (port 0) and a client on it; closes all."""
    app = FastAPI()
    app.include_router(create_gateway_router(proxy))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False) as client:
            yield client
    finally:
        server.should_exit = True
        await task
        await proxy.close()
