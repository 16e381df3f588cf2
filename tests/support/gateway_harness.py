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
