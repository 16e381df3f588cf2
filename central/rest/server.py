"""Central's REST listener: the FastAPI app under uvicorn, on the process's event loop."""

from __future__ import annotations

import asyncio

import uvicorn
from fastapi import FastAPI

from fleetwire.tls import HTTP_DRAIN_S, TlsMaterial, uvicorn_ssl_kwargs, wait_http_stopped


class RestServer:
    """Serves ``app`` on ``host:port`` (0: a free port), over HTTPS with ``material``; an idle
    keep-alive connection is closed after ``idle_timeout_s``."""

    def __init__(
        self, app: FastAPI, host: str, port: int, material: TlsMaterial | None = None, *, idle_timeout_s: int = 5
    ) -> None:
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=idle_timeout_s,
            timeout_graceful_shutdown=HTTP_DRAIN_S,
            # operators authenticate with bearer tokens, not certificates
            **(uvicorn_ssl_kwargs(material, require_client_cert=False) if material is not None else {}),
        )
        self._server = uvicorn.Server(self._config)
        self._task: asyncio.Task[None] | None = None
        #: The bound port once started.
        self.port = port

    async def start(self) -> int:
        """Bind and serve; returns the bound port once uvicorn accepts connections."""
        self._task = task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if task.done():
                task.result()
                raise RuntimeError("central's HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop taking connections; requests in flight get ``HTTP_DRAIN_S`` to finish."""
        if self._task is None:
            return
        self._server.should_exit = True
        await wait_http_stopped(self._server, self._task)
