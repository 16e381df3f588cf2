"""Central's gRPC listeners: the Registry service for edges, and the gateway's KServe v2
inference service (grpcio aio)."""

from __future__ import annotations

import grpc

from central.gateway import GatewayProxy
from central.gateway.catalog import GatedCatalog
from central.grpc.gateway_servicer import GatewayInferenceServicer
from central.grpc.registry_servicer import RegistryServicer
from central.handlers import EdgeHandlers
from fleetwire.kserve.server import InferenceServer
from fleetwire.tls import TlsMaterial, grpc_idle_options, grpc_server_credentials
from fleetwire.v1 import registry_pb2_grpc

_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
    # Edges ping every 20 s (keepalive_time_ms) on their long, mostly idle watch stream; the
    # default minimum of 5 min between pings without data answers the third with GOAWAY
    # "too_many_pings", which cut the stream every minute (and moved edges between replicas).
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
]


class GrpcServer:
    """Serves the Registry over ``edges`` on ``host:port`` (0: a free port); with ``material``
    over TLS, demanding a fleet certificate with ``require_client_cert``; a connection with
    no call open is closed after ``idle_timeout_s``."""

    def __init__(
        self,
        edges: EdgeHandlers,
        host: str,
        port: int,
        material: TlsMaterial | None = None,
        *,
        require_client_cert: bool = False,
        idle_timeout_s: float = 300.0,
    ) -> None:
        self._edges = edges
        self._idle_timeout_s = idle_timeout_s
        self._address = f"{host}:{port}"
        self._material = material
        self._require_client_cert = require_client_cert
        self._server: grpc.aio.Server | None = None
        #: The bound port once started.
        self.port = port

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        self._server = server = grpc.aio.server(options=[*_GRPC_OPTIONS, *grpc_idle_options(self._idle_timeout_s)])
        registry_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(self._edges), server)
        if self._material is not None:
            creds = grpc_server_credentials(self._material, require_client_cert=self._require_client_cert)
            self.port = server.add_secure_port(self._address, creds)
        else:
            self.port = server.add_insecure_port(self._address)
        await server.start()
        return self.port

    async def stop(self) -> None:
        """Stop, giving calls in flight a second."""
        if self._server is not None:
            await self._server.stop(grace=1.0)


def gateway_inference_server(
    proxy: GatewayProxy,
    catalog: GatedCatalog,
    host: str,
    port: int,
    *,
    max_message_bytes: int,
    material: TlsMaterial | None = None,
    idle_timeout_s: float | None = None,
) -> InferenceServer:
    """The gateway over KServe v2 gRPC on its own port, with the REST API's TLS: inference
    clients show no fleet certificate (the Registry's port may demand one), and its messages
    are as large as the gateway's bodies may be."""
    servicer = GatewayInferenceServicer(proxy, catalog)
    return InferenceServer(
        servicer, host, port, max_message_bytes=max_message_bytes, tls_material=material, idle_timeout_s=idle_timeout_s
    )
