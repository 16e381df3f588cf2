"""Central's process: REST (uvicorn) and gRPC (grpcio aio) on one event loop,
sharing one ``Central``. Owns start-up order, signals and shutdown."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

import grpc
import uvicorn

from central.core import Central
from central.gateway.grpc_servicer import GatewayInferenceServicer
from central.settings import CentralSettings
from central.transport.grpc_servicer import RegistryServicer
from central.transport.rest import create_app
from fleetwire.exposure import warn_if_wide_open
from fleetwire.kserve.server import InferenceServer
from fleetwire.tls import HTTP_DRAIN_S, grpc_server_credentials, uvicorn_ssl_kwargs, wait_http_stopped
from fleetwire.v1 import registry_pb2_grpc

log = logging.getLogger(__name__)

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
    # Edges ping every 20 s (keepalive_time_ms) on their long, mostly idle watch stream; the
    # default minimum of 5 min between pings without data answers the third with GOAWAY
    # "too_many_pings", which cut the stream every minute (and moved edges between replicas).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
]


class CentralServer:
    """Start and stop one central; ports of 0 are resolved on start."""

    def __init__(self, settings: CentralSettings) -> None:
        self.settings = settings
        self.central = Central(settings)
        self._grpc: grpc.aio.Server | None = None
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._infer_grpc: InferenceServer | None = None
        self.grpc_port = settings.grpc_port
        self.http_port = settings.http_port

    @property
    def grpc_address(self) -> str:
        """host:port of the Registry service."""
        return f"{self.settings.grpc_host}:{self.grpc_port}"

    @property
    def infer_grpc_address(self) -> str | None:
        """host:port of the gateway's KServe v2 gRPC inference service; None when it is off."""
        if self._infer_grpc is None:
            return None
        return f"{self.settings.http_host}:{self._infer_grpc.port}"

    @property
    def http_url(self) -> str:
        """Base URL of the REST API (``https`` with ``tls.enabled``)."""
        scheme = "https" if self.settings.tls.enabled else "http"
        return f"{scheme}://{self.settings.http_host}:{self.http_port}"

    async def start(self) -> None:
        """Bind both servers; returns when they accept connections."""
        self.central.start()
        if self.central.mqtt is not None:
            await self.central.mqtt.start()
        self._grpc = grpc.aio.server(options=_GRPC_OPTIONS)
        registry_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(self.central), self._grpc)
        address = f"{self.settings.grpc_host}:{self.settings.grpc_port}"
        tls, material = self.settings.tls, self.central.tls_material
        if material is not None:
            creds = grpc_server_credentials(material, require_client_cert=tls.require_client_cert)
            self.grpc_port = self._grpc.add_secure_port(address, creds)
        else:
            self.grpc_port = self._grpc.add_insecure_port(address)
        await self._grpc.start()
        config = uvicorn.Config(
            create_app(self.central),
            host=self.settings.http_host,
            port=self.settings.http_port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=HTTP_DRAIN_S,
            # operators authenticate with bearer tokens, not certificates
            **(uvicorn_ssl_kwargs(material, require_client_cert=False) if material is not None else {}),
        )
        self._http = uvicorn.Server(config)
        self._http_task = asyncio.create_task(self._http.serve())
        while not self._http.started:
            if self._http_task.done():
                self._http_task.result()
                raise RuntimeError("central's HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]
        await self._start_infer_grpc()
        if self.central.replica is not None:  # last: others route to it once it says it is up
            await self.central.replica.start(http_url=self.http_url, grpc_address=self.grpc_address)
        log.info("central up: REST %s, gRPC %s", self.http_url, self.grpc_address)
        infer_port = self._infer_grpc.port if self._infer_grpc is not None else None
        listeners = self.settings.listeners(self.http_port, self.grpc_port, infer_port)
        warn_if_wide_open(log, listeners)

    async def _start_infer_grpc(self) -> None:
        """Serve the gateway over KServe v2 gRPC on its own port (``gateway.grpc_port``), with
        the REST API's TLS: inference clients show no fleet certificate (the Registry's port
        may demand one), and its messages are as large as the gateway's bodies may be."""
        gateway = self.settings.gateway
        if not gateway.enabled or gateway.grpc_port is None:
            return
        self._infer_grpc = InferenceServer(
            GatewayInferenceServicer(self.central.gateway, self.central.registry.describe),
            self.settings.http_host,
            gateway.grpc_port,
            max_message_bytes=gateway.max_body_bytes,
            tls_material=self.central.tls_material,
        )
        await self._infer_grpc.start()

    async def stop(self) -> None:
        """Close streams and listeners, then the store."""
        if self.central.replica is not None:  # first: leadership and partitions move at once
            await self.central.replica.stop()
        if self.central.mqtt is not None:  # first: freezes the tracker, nobody is evicted
            await self.central.mqtt.stop()
        if self._http is not None and self._http_task is not None:
            self.central.dashboard.close()  # open event streams would hold uvicorn's shutdown
            self._http.should_exit = True
            await wait_http_stopped(self._http, self._http_task)
        if self._infer_grpc is not None:
            await self._infer_grpc.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.central.gateway.close()
        self.central.close()


#: Young-generation size before a collection. Central keeps one small object graph per
#: node (its last heartbeat) that lives until the next one replaces it; with CPython's
#: default of 700 a 10k-node fleet triggers a collection every few dozen heartbeats and
#: the older generations are walked again and again (11 % of central's CPU, measured).
_GC_THRESHOLDS = (50_000, 20, 20)


async def serve(settings: CentralSettings) -> None:
    """Run a central until SIGINT or SIGTERM."""
    # MQTT, gRPC and HTTP share one loop; the only other Python threads are gRPC's poller
    # and the executor. Freezing the start-up heap keeps the collector off the long-lived
    # objects (modules, settings, models), and larger generations make it run rarely.
    gc.set_threshold(*_GC_THRESHOLDS)
    server = CentralServer(settings)
    await server.start()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # One write, so a log line from another thread cannot split the ready line (see the edge's).
    infer = f" infer_grpc={server.infer_grpc_address}" if server.infer_grpc_address is not None else ""
    sys.stdout.write(f"central ready http={server.http_url} grpc={server.grpc_address}{infer}\n")
    sys.stdout.flush()
    await stop.wait()
    await server.stop()
