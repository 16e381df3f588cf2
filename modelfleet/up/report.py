"""What ``modelfleet up`` tells a person (a table of URLs) and a script (``--json-status``)
once the fleet is up."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from modelfleet.up.broker import RunningBroker
from modelfleet.up.datadir import DataDir
from modelfleet.up.demo import MODEL, Accuracy, Published
from modelfleet.up.services import Service
from modelfleet.up.status import (
    AccuracyStatus,
    BrokerStatus,
    CentralStatus,
    EdgeStatus,
    FleetStatus,
    ModelStatus,
)

__all__ = ["Fleet", "print_urls", "status_of"]


@dataclass(frozen=True)
class Fleet:
    """A fleet that is up, with the demo model served."""

    broker: RunningBroker
    central: Service
    edges: list[Service]
    published: Published
    accuracy: Accuracy


def print_urls(console: Console, fleet: Fleet, data: DataDir) -> None:
    """The addresses a person wants next: dashboard, gateway, API, each edge, metrics."""
    c = fleet.central.http_url
    rows = [
        ("dashboard", f"{c}/dashboard"),
        ("gateway", f"{c}/v2/models/{MODEL}/infer"),
        ("registry API", f"{c}/api/v1/models"),
        ("membership", f"{c}/api/v1/membership"),
        ("central metrics", f"{c}/metrics"),
        ("central gRPC", fleet.central.grpc_address),
        *((edge.name, f"{edge.http_url}   metrics: {edge.http_url}/metrics") for edge in fleet.edges),
        ("broker", f"{fleet.broker.url} ({fleet.broker.kind})"),
        ("data", f"{data.root}   logs: {data.logs}"),
    ]
    for label, value in rows:
        console.print(f"  [bold]{label:<16}[/bold] {escape(value)}", soft_wrap=True, highlight=False)


def status_of(fleet: Fleet, data: DataDir) -> FleetStatus:
    """The ``--json-status`` document."""
    b, c, a = fleet.broker, fleet.central, fleet.accuracy
    return FleetStatus(
        pid=os.getpid(),
        data_dir=str(data.root),
        broker=BrokerStatus(kind=b.kind, url=b.url, host=b.host, port=b.port, pid=b.child.pid),
        central=CentralStatus(
            http_url=c.http_url,
            http_port=c.http_port,
            grpc_address=c.grpc_address,
            grpc_port=c.grpc_port,
            dashboard_url=f"{c.http_url}/dashboard",
            gateway_url=f"{c.http_url}/v2/models/{MODEL}/infer",
            metrics_url=f"{c.http_url}/metrics",
            pid=c.child.pid,
        ),
        edges=[
            EdgeStatus(
                node_id=e.name,
                http_url=e.http_url,
                http_port=e.http_port,
                grpc_address=e.grpc_address,
                grpc_port=e.grpc_port,
                metrics_url=f"{e.http_url}/metrics",
                pid=e.child.pid,
            )
            for e in fleet.edges
        ],
        model=ModelStatus(
            name=MODEL,
            version=fleet.published.version,
            artifact=fleet.published.artifact,
            pushed=fleet.published.pushed,
        ),
        demo=AccuracyStatus(
            correct=a.correct, total=a.total, requests=a.requests, accuracy=a.value, nodes=list(a.nodes)
        ),
    )
