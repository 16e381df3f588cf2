"""Central and the edges as ``python -m modelfleet central|edge`` children, each with
its data under the fleet's directory so the next ``up`` finds its registry and caches.

Options given here win over the environment; everything else (``MODELFLEET_*``) the
children read themselves, so ``MODELFLEET_QUANTIZE__ENABLED=false make up`` works.

Their command lines and ready lines are shared with the benchmarks' ``bench._fleet``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from modelfleet.up.children import Child, ChildGroup, wait_ready
from modelfleet.up.ports import PortPlan, available

__all__ = [
    "CENTRAL_READY",
    "EDGE_READY",
    "Service",
    "central_args",
    "edge_args",
    "edge_ids",
    "port_of",
    "spawn_central",
    "spawn_edges",
    "wait_central",
    "wait_edges",
]

#: The line central prints once it listens, naming the ports it bound.
#: ``infer_grpc``: the KServe v2 gRPC inference port, when it is on.
CENTRAL_READY = re.compile(
    r"^central ready http=(?P<http>\S+) grpc=(?P<grpc>\S+)(?: infer_grpc=(?P<infer_grpc>\S+))?\s*$", re.M
)
#: The same for an edge.
EDGE_READY = re.compile(
    r"^edge (?P<node>\S+) ready http=(?P<http>\S+) grpc=(?P<grpc>\S+)(?: infer_grpc=(?P<infer_grpc>\S+))?\s*$", re.M
)
#: Defaults for a fleet on one machine, unless the environment says otherwise: heartbeats
#: every second, so membership (and the dashboard) sees a killed edge within seconds.
_EDGE_ENV_DEFAULTS = {"MODELFLEET_HEARTBEAT__INTERVAL_S": "1", "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "1"}


@dataclass(frozen=True)
class Service:
    """A started central or edge: its name, where it listens, its process."""

    name: str
    http_url: str
    grpc_address: str
    child: Child

    @property
    def http_port(self) -> int:
        """The HTTP port it bound."""
        return port_of(self.http_url)

    @property
    def grpc_port(self) -> int:
        """The gRPC port it bound."""
        return port_of(self.grpc_address)


def port_of(address: str) -> int:
    """The port of ``http://host:port`` or ``host:port``."""
    return int(address.rsplit(":", 1)[1])


def central_args(data_dir: Path, http_port: int, grpc_port: int, broker: str | None = None) -> list[str]:
    """``modelfleet central …`` arguments (after ``-m modelfleet``); 0 for a port: any free one."""
    broker_args = ["--broker", broker] if broker is not None else []
    return [
        "central", "--data-dir", str(data_dir), *broker_args,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
    ]  # fmt: skip


def edge_args(
    node_id: str, central_grpc: str, data_dir: Path, http_port: int, grpc_port: int, broker: str | None = None
) -> list[str]:
    """``modelfleet edge …`` arguments: its cache in ``data_dir/cache``; 0 for a port: any free one."""
    broker_args = ["--broker", broker] if broker is not None else []
    return [
        "edge", "--node-id", node_id, "--central", central_grpc, *broker_args,
        "--data-dir", str(data_dir), "--cache-dir", str(data_dir / "cache"),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
    ]  # fmt: skip


def edge_ids(count: int) -> list[str]:
    """``edge-1`` … ``edge-N``: stable names, so a restarted fleet finds its edges' data."""
    return [f"edge-{i}" for i in range(1, count + 1)]


def _env_defaults(defaults: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in defaults.items() if k not in os.environ}


def spawn_central(
    group: ChildGroup,
    ports: PortPlan,
    data_dir: Path,
    broker: str,
    grpc_port: int,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start central on the planned HTTP port (a free one if taken); ``wait_central`` for it.
    ``env``: settings that win over the caller's environment (``--secure``'s)."""
    args = central_args(data_dir / "central", available(ports.central_http), grpc_port, broker)
    return group.spawn_modelfleet("central", args, env)


def wait_central(child: Child, timeout_s: float) -> Service:
    """Wait for central's ready line, which names the ports it bound."""
    ready = child.wait_line(CENTRAL_READY, timeout_s)
    return Service("central", ready["http"], ready["grpc"], child)


def spawn_edges(
    group: ChildGroup,
    ports: PortPlan,
    data_dir: Path,
    central_grpc: str,
    broker: str,
    env_for: Callable[[str], Mapping[str, str]] | None = None,
) -> list[Child]:
    """Start every edge at once; they boot beside central and connect once it listens.
    ``env_for(node_id)``: settings that win over the environment (``--secure``'s)."""
    defaults = _env_defaults(_EDGE_ENV_DEFAULTS)
    children = []
    ids = edge_ids(len(ports.edge_http))
    for node_id, http_port, grpc_port in zip(ids, ports.edge_http, ports.edge_grpc, strict=True):
        edge_dir = data_dir / "edges" / node_id
        args = edge_args(node_id, central_grpc, edge_dir, available(http_port), available(grpc_port), broker)
        env = {**defaults, **(env_for(node_id) if env_for is not None else {})}
        children.append(group.spawn_modelfleet(node_id, args, env))
    return children


def wait_edges(children: list[Child], timeout_s: float) -> list[Service]:
    """Wait for every edge's ready line (``timeout_s`` for all of them)."""
    ready = wait_ready(children, EDGE_READY, timeout_s)
    return [Service(child.name, line["http"], line["grpc"], child) for child, line in zip(children, ready, strict=True)]
