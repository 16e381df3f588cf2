"""A grpc.aio server for ``inference.GRPCInferenceService`` (an edge's, central's gateway's):
its own port, since inference clients are local devices and applications, not fleet members.
TLS as on the process's HTTP side (a client certificate only where that side asks for one);
the largest message it accepts is the transport's request body limit."""

from __future__ import annotations

import grpc

from fleetwire.kserve import grpc_predict_v2_pb2_grpc
from fleetwire.tls import TlsMaterial, grpc_idle_options, grpc_server_credentials

__all__ = ["InferenceServer"]


class InferenceServer:
    """Serves one ``GRPCInferenceServiceServicer`` on ``host:port`` (0: a free port)."""

    def __init__(
        self,
        servicer: grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer,
        host: str,
        port: int,
        *,
        max_message_bytes: int,
        tls_material: TlsMaterial | None = None,
        require_client_cert: bool = False,
        idle_timeout_s: float | None = None,
    ) -> None:
        """``idle_timeout_s``: close a connection with no call open that long
        (``fleetwire.tls.grpc_idle_options``)."""
        self.servicer = servicer
        self.host = host
        self.port = port
        """The bound port once started."""
        self.max_message_bytes = max_message_bytes
        self.tls_material = tls_material
        self.require_client_cert = require_client_cert
        self.idle_timeout_s = idle_timeout_s
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        options = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", -1),  # answers are as large as the model makes them
            ("grpc.so_reuseport", 0),  # a second process on a taken port must fail, not share it
            *(grpc_idle_options(self.idle_timeout_s) if self.idle_timeout_s is not None else []),
        ]
        server = grpc.aio.server(options=options)
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        address = f"{self.host}:{self.port}"
        if self.tls_material is not None:
            creds = grpc_server_credentials(self.tls_material, require_client_cert=self.require_client_cert)
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        return self.port

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop accepting calls; those in flight get ``grace_s`` to finish (idempotent)."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=grace_s)
