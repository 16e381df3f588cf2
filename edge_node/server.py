"""The edge process: Peer gRPC server, HTTP API and the desired-state follower on one
event loop, around one ``Edge`` (``edge_node.core``). Owns the listeners, start-up
order, signals and shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

import grpc

from edge_node.core import Edge
from edge_node.fetch.sources import CHANNEL_OPTIONS
from edge_node.grpc import InferenceServicer
from edge_node.settings import EdgeSettings
from fleetwire.body_deadline import BodyDeadline
from fleetwire.exposure import warn_if_wide_open
from fleetwire.kserve.server import InferenceServer
from fleetwire.tls import (
    HTTP_DRAIN_S,
    grpc_idle_options,
    grpc_server_credentials,
    uvicorn_ssl_kwargs,
    wait_http_stopped,
)
from fleetwire.v1 import peer_pb2_grpc

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)


def _import_http_stack() -> None:
    """Import the HTTP API's modules (FastAPI, uvicorn): about a fifth of an edge's start.
    ``EdgeServer._start_http`` runs this in a worker thread after ``Edge.restore``, so a
    restarted edge checks and loads its models (hashing and ORT release the GIL) meanwhile."""
    import uvicorn  # noqa: F401

    import edge_node.rest.app  # noqa: F401


class EdgeServer:
    """Start and stop one edge and its listeners; ports of 0 are resolved on start."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.edge = Edge(settings)
        self._grpc: grpc.aio.Server | None = None
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._infer_grpc: InferenceServer | None = None
        self._stopped = False

    @property
    def node_id(self) -> str:
        """The edge's node id."""
        return self.edge.node_id

    @property
    def grpc_port(self) -> int:
        """Port of the Peer service (the bound one once started)."""
        return self.edge.grpc_port

    @property
    def http_port(self) -> int:
        """Port of the HTTP API (the bound one once started)."""
        return self.edge.http_port

    @property
    def infer_grpc_port(self) -> int | None:
        """Port of the KServe v2 gRPC inference service (the bound one once started; None: off)."""
        return self.edge.infer_grpc_port

    @property
    def infer_grpc_address(self) -> str | None:
        """host:port of the KServe v2 gRPC inference service, None when it is off."""
        port = self.infer_grpc_port
        return None if port is None else f"{self.settings.http_host}:{port}"

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP API (``https`` with ``tls.enabled``)."""
        scheme = "https" if self.settings.tls.enabled else "http"
        return f"{scheme}://{self.settings.http_host}:{self.http_port}"

    async def start(self) -> None:
        """Load the models kept on disk first (central may be down; the checks and session
        creation run in threads while the listeners come up), then listen: HTTP, so local
        inference answers as soon as a model is loaded, then peers. Then follow central:
        heartbeats and the registration carry both ports, so peers reach us once central
        lists us."""
        edge = self.edge
        edge.restore()
        try:
            edge.http_port = await self._start_http()
            await self._start_infer_grpc()
            edge.grpc_port = await self._start_grpc()
        except Exception:
            await edge.stop_work()  # the loads restore() started: no task outlives a failed start
            raise
        await edge.start()
        log.info("edge %s up: peer %s, http %d", edge.node_id, edge.grpc_address, edge.http_port)
        warn_if_wide_open(
            log,
            self.settings.listeners(
                http_port=edge.http_port, grpc_port=edge.grpc_port, infer_grpc_port=self.infer_grpc_port
            ),
        )

    async def _start_grpc(self) -> int:
        """Serve the Peer service; returns the bound port."""
        edge = self.edge
        # The server's keep-alive and idle options over the channels' (one value per key).
        options = {**dict(CHANNEL_OPTIONS), **dict(grpc_idle_options(self.settings.limits.grpc_idle_timeout_s))}
        self._grpc = grpc.aio.server(options=list(options.items()))
        peer_pb2_grpc.add_PeerServicer_to_server(edge.peer_servicer, self._grpc)
        address = f"{self.settings.grpc_host}:{self.settings.grpc_port}"
        if edge.tls_material is not None:  # peers are mutual: a caller without a fleet certificate is refused
            creds = grpc_server_credentials(edge.tls_material, require_client_cert=True)
            port = self._grpc.add_secure_port(address, creds)
        else:
            port = self._grpc.add_insecure_port(address)
        await self._grpc.start()
        return port

    async def _start_infer_grpc(self) -> None:
        """Serve KServe v2 gRPC inference over the HTTP API's plane, on its own port with the
        HTTP API's TLS (inference clients are local devices, not fleet members), unless off."""
        settings = self.settings
        if settings.infer_grpc_port is None:
            return
        self._infer_grpc = InferenceServer(
            InferenceServicer(self.edge.plane),
            settings.http_host,
            settings.infer_grpc_port,
            max_message_bytes=settings.limits.max_infer_body_bytes,
            tls_material=self.edge.tls_material,
            require_client_cert=settings.tls.require_client_cert,
            idle_timeout_s=settings.limits.grpc_idle_timeout_s,
        )
        self.edge.infer_grpc_port = await self._infer_grpc.start()

    async def _start_http(self) -> int:
        """Serve the HTTP API; returns the bound port."""
        await asyncio.to_thread(_import_http_stack)  # off the loop: restored models load meanwhile
        import uvicorn

        from edge_node.rest.app import create_app

        edge, tls, limits = self.edge, self.settings.tls, self.settings.limits
        app = create_app(
            edge.plane, edge.status, language=edge.language, bench_endpoints=self.settings.inference.bench_endpoints
        )
        config = uvicorn.Config(
            BodyDeadline(app, limits.body_timeout_s),  # a body not in within it: 408, connection closed
            timeout_keep_alive=limits.http_idle_timeout_s,
            host=self.settings.http_host,
            port=self.settings.http_port,
            log_level="warning",
            lifespan="off",
            ws="none",  # no WebSocket routes: skips importing the websockets stack at start-up
            access_log=False,  # a log record per request costs the loop; Prometheus counts them
            proxy_headers=False,  # nothing here reads X-Forwarded-*: skip uvicorn's middleware for them
            timeout_graceful_shutdown=HTTP_DRAIN_S,
            **(
                uvicorn_ssl_kwargs(edge.tls_material, require_client_cert=tls.require_client_cert)
                if edge.tls_material is not None
                else {}
            ),
        )
        self._http = uvicorn.Server(config)
        self._http_task = asyncio.create_task(self._http.serve())
        while not self._http.started:
            if self._http_task.done():
                self._http_task.result()
                raise RuntimeError("edge HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        port: int = self._http.servers[0].sockets[0].getsockname()[1]
        return port

    async def stop(self, unregister: bool = True) -> None:
        """Leave the fleet, stop work and close listeners and the cache (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await self.edge.leave(unregister=unregister)
        if self._grpc is not None:  # first, so no peer request starts a fetch after this
            await self._grpc.stop(grace=0.5)
        if self._infer_grpc is not None:  # before the sessions it runs on are released
            await self._infer_grpc.stop()
        await self.edge.stop_work()
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await wait_http_stopped(self._http, self._http_task)
        await self.edge.close()


async def serve(settings: EdgeSettings) -> None:
    """Run an edge until SIGINT or SIGTERM."""
    sys.setswitchinterval(settings.inference.switch_interval_s)  # how long a batch's thread may wait for the GIL
    server = EdgeServer(settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # One write: print() writes the text and its newline separately, and a log line from
    # another thread (stderr, often the same file) landing between them hid the ready line.
    infer = f" infer_grpc={server.infer_grpc_address}" if server.infer_grpc_address is not None else ""
    sys.stdout.write(f"edge {server.node_id} ready http={server.http_url} grpc={server.edge.grpc_address}{infer}\n")
    sys.stdout.flush()
    await stop.wait()
    await server.stop()
