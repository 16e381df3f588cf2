"""Central and the edges as ``python -m modelfleet central|edge`` children, each with
its data under the fleet's directory so the next ``up`` finds its registry and caches.

Options given here win over the environment; everything else (``MODELFLEET_*``) the
children read themselves, so ``MODELFLEET_QUANTIZE__ENABLED=false make up`` works."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from modelfleet.up.children import Child, ChildGroup
from modelfleet.up.ports import PortPlan, available

__all__ = [
    "Service",
    "edge_ids",
    "spawn_central",
    "spawn_edges",
    "wait_central",
    "wait_edges",
]

_CENTRAL_READY = re.compile(r"^central ready http=(?P<http>\S+) grpc=(?P<grpc>\S+)\s*$", re.M)
_EDGE_READY = re.compile(r"^edge (?P<node>\S+) ready http=(?P<http>\S+) grpc=(?P<grpc>\S+)\s*$", re.M)
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
        return int(self.http_url.rsplit(":", 1)[1])

    @property
    def grpc_port(self) -> int:
        """The gRPC port it bound."""
        return int(self.grpc_address.rsplit(":", 1)[1])


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
    args = [
        "central", "--data-dir", str(data_dir / "central"), "--broker", broker,
        "--http-port", str(available(ports.central_http)), "--grpc-port", str(grpc_port),
    ]  # fmt: skip
    return group.spawn_modelfleet("central", args, env)


def wait_central(child: Child, timeout_s: float) -> Service:
    """Wait for central's ready line, which names the ports it bound."""
    ready = child.wait_line(_CENTRAL_READY, timeout_s)
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
        args = [
            "edge", "--node-id", node_id, "--central", central_grpc, "--broker", broker,
            "--data-dir", str(edge_dir), "--cache-dir", str(edge_dir / "cache"),
            "--http-port", str(available(http_port)), "--grpc-port", str(available(grpc_port)),
        ]  # fmt: skip
        env = {**defaults, **(env_for(node_id) if env_for is not None else {})}
        children.append(group.spawn_modelfleet(node_id, args, env))
    return children


def wait_edges(children: list[Child], timeout_s: float) -> list[Service]:
    """Wait for every edge's ready line."""
    services = []
    for child in children:
        ready = child.wait_line(_EDGE_READY, timeout_s)
        services.append(Service(child.name, ready["http"], ready["grpc"], child))
    return services
