"""Which ports the local fleet asks for: fixed ones a human can remember (central on
8080, edges on 8081…, the broker on 1883), or a block from ``--base-port``, and a free
port instead of any that is taken. ``--base-port 0`` takes free ports throughout.

Central and edges are given 0 for a taken port and report the port they bound on
their ready line; only the broker needs a concrete number up front."""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["PortPlan", "available", "concrete", "free_port", "port_is_free"]

HOST = "127.0.0.1"
DEFAULT_CENTRAL_HTTP = 8080
DEFAULT_CENTRAL_GRPC = 50051
DEFAULT_BROKER = 1883
#: With ``--base-port B``: central HTTP B, edges B+1…, central gRPC B+10, edge gRPC B+11…, broker B+20.
GRPC_OFFSET = 10
BROKER_OFFSET = 20
MAX_EDGES = 9


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when a server could bind ``host:port`` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class PortPlan:
    """The ports wanted for one fleet; 0 means "any free one"."""

    central_http: int
    central_grpc: int
    broker: int
    edge_http: tuple[int, ...]
    edge_grpc: tuple[int, ...]

    @classmethod
    def build(cls, edges: int, base_port: int | None) -> PortPlan:
        """The human defaults (``base_port`` None), a block from ``base_port``, or all 0."""
        if not 1 <= edges <= MAX_EDGES:
            raise ValueError(f"edges must be between 1 and {MAX_EDGES}, got {edges}")
        if base_port == 0:
            return cls(0, 0, 0, (0,) * edges, (0,) * edges)
        if base_port is None:
            http, grpc, broker = DEFAULT_CENTRAL_HTTP, DEFAULT_CENTRAL_GRPC, DEFAULT_BROKER
        elif not 1024 <= base_port <= 65535 - BROKER_OFFSET:
            raise ValueError(f"base port must be 0 or between 1024 and {65535 - BROKER_OFFSET}, got {base_port}")
        else:
            http, grpc, broker = base_port, base_port + GRPC_OFFSET, base_port + BROKER_OFFSET
        return cls(
            central_http=http,
            central_grpc=grpc,
            broker=broker,
            edge_http=tuple(http + 1 + i for i in range(edges)),
            edge_grpc=tuple(grpc + 1 + i for i in range(edges)),
        )


def available(port: int) -> int:
    """``port`` when it is free, else 0 (the server picks one and reports it)."""
    return port if port and port_is_free(port) else 0


def concrete(port: int) -> int:
    """``port`` when it is free, else a free port chosen now (for the broker)."""
    return port if port and port_is_free(port) else free_port()
