"""Central's process: REST (``central.rest``) and gRPC (``central.grpc``) listeners and the
MQTT consumer on one event loop, over one ``Central``. Owns start-up order, signals and shutdown."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from central.core import Central
from central.grpc.server import GrpcServer, gateway_inference_server
from central.rest.app import create_app
from central.rest.server import RestServer
from central.settings import CentralSettings
from fleetwire.exposure import warn_if_wide_open
from fleetwire.kserve.server import InferenceServer

log = logging.getLogger(__name__)


class CentralServer:
    """Start and stop one central; ports of 0 are resolved on start."""

    def __init__(self, settings: CentralSettings) -> None:
        self.settings = settings
        self.central = central = Central(settings)
        handlers, material = central.handlers, central.tls_material
        self._grpc = GrpcServer(
            central.edge_handlers,
            settings.grpc_host,
            settings.grpc_port,
            material,
            require_client_cert=settings.tls.require_client_cert,
            idle_timeout_s=settings.grpc_idle_timeout_s,
        )
        self._http = RestServer(
            create_app(handlers, settings),
            settings.http_host,
            settings.http_port,
            material,
            idle_timeout_s=settings.http_idle_timeout_s,
        )
        self._infer_grpc = self._inference_server()
        self.grpc_port = settings.grpc_port
        self.http_port = settings.http_port

    def _inference_server(self) -> InferenceServer | None:
        """The gateway over KServe v2 gRPC (``gateway.grpc_port``); None when it is off."""
        gateway = self.settings.gateway
        if not gateway.enabled or gateway.grpc_port is None:
            return None
        handlers = self.central.handlers
        return gateway_inference_server(
            handlers.gateway,
            handlers.catalog,
            self.settings.http_host,
            gateway.grpc_port,
            max_message_bytes=gateway.max_body_bytes,
            material=self.central.tls_material,
            idle_timeout_s=self.settings.grpc_idle_timeout_s,
        )

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
        """Bind every listener; returns when they accept connections."""
        central = self.central
        central.start()
        if central.mqtt is not None:
            await central.mqtt.start()
        self.grpc_port = await self._grpc.start()
        self.http_port = await self._http.start()
        if self._infer_grpc is not None:
            await self._infer_grpc.start()
        # last: other replicas route to this one once it says it is up
        await central.mode.start(http_url=self.http_url, grpc_address=self.grpc_address)
        log.info("central up: REST %s, gRPC %s", self.http_url, self.grpc_address)
        infer_port = self._infer_grpc.port if self._infer_grpc is not None else None
        warn_if_wide_open(log, self.settings.listeners(self.http_port, self.grpc_port, infer_port))

    async def stop(self) -> None:
        """Close streams and listeners, then the stores."""
        central = self.central
        await central.mode.stop()  # first: leadership and partitions move at once
        if central.mqtt is not None:  # first: freezes the tracker, nobody is evicted
            await central.mqtt.stop()
        central.dashboard.close()  # open event streams would hold uvicorn's shutdown
        await self._http.stop()
        if self._infer_grpc is not None:
            await self._infer_grpc.stop()
        await self._grpc.stop()
        await central.gateway.close()
        await central.conversions.stop()  # their threads write to the stores closed next
        central.close()


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
