"""What ``modelfleet up`` tells a person (a table of URLs) and a script (``--json-status``)
once the fleet is up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from modelfleet.up.broker import RunningBroker
from modelfleet.up.datadir import DataDir
from modelfleet.up.demo import MODEL, Accuracy, Published
from modelfleet.up.ha import SharedState
from modelfleet.up.secure import SecureFleet
from modelfleet.up.services import Service
from modelfleet.up.status import (
    AccuracyStatus,
    BrokerStatus,
    CentralStatus,
    EdgeStatus,
    FleetStatus,
    ModelStatus,
    ReplicaStatus,
    SecureStatus,
    SharedStatus,
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
    secure: SecureFleet | None = None
    #: ``--ha``: every central replica, ``central`` first; empty for a single central.
    replicas: list[Service] = field(default_factory=list)
    #: ``--ha``: the PostgreSQL and S3 server the replicas share.
    shared: SharedState | None = None


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
        *((r.name, f"{r.http_url}   gRPC: {r.grpc_address}") for r in fleet.replicas),
        *_shared_rows(fleet.shared),
        *((edge.name, f"{edge.http_url}   metrics: {edge.http_url}/metrics") for edge in fleet.edges),
        ("broker", f"{fleet.broker.url} ({fleet.broker.kind})"),
        ("data", f"{data.root}   logs: {data.logs}"),
    ]
    for label, value in rows:
        console.print(f"  [bold]{label:<16}[/bold] {escape(value)}", soft_wrap=True, highlight=False)
    if fleet.secure is not None:
        _print_secure(console, fleet, fleet.secure)


def _shared_rows(shared: SharedState | None) -> list[tuple[str, str]]:
    """Where ``--ha``'s database and bucket are (the password stays in the replicas' environment)."""
    if shared is None:
        return []
    pg = shared.postgres
    return [
        ("PostgreSQL", f"{pg.host}:{pg.port} (database {pg.url.rsplit('/', 1)[1]}, gone when the fleet stops)"),
        ("S3", f"{shared.s3.endpoint} bucket {shared.bucket} (in memory)"),
    ]


def _print_secure(console: Console, fleet: Fleet, secure: SecureFleet) -> None:
    """How to reach a ``--secure`` fleet: the CLI's three variables, and curl to an edge."""
    console.print(
        "[bold]Secure fleet[/bold]: TLS everywhere (CA below), reads and writes need the admin token"
        " (the dashboard asks for it once), edges want a client certificate."
        " For the CLI (`modelfleet nodes`, `modelfleet push`, …):",
        highlight=False,
    )
    lines = [
        f"export MODELFLEET_CENTRAL_URL={fleet.central.http_url}",
        f"export MODELFLEET_CA_FILE={secure.ca_file}",
        f"export MODELFLEET_TOKEN=$(cat {secure.admin_token_file})",
    ]
    if fleet.edges:
        op, edge = secure.operator_tls, fleet.edges[0]
        lines.append(
            f"curl --cacert {secure.ca_file} --cert {op.cert_file} --key {op.key_file} {edge.http_url}/metrics"
        )
    for line in lines:
        console.print(f"  {escape(line)}", soft_wrap=True, highlight=False, markup=True)


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
        secure=_secure_status(fleet.secure),
        replicas=[
            ReplicaStatus(
                replica_id=r.name,
                http_url=r.http_url,
                grpc_address=r.grpc_address,
                healthz_url=f"{r.http_url}/healthz",
                pid=r.child.pid,
            )
            for r in fleet.replicas
        ],
        shared=_shared_status(fleet.shared),
    )


def _shared_status(shared: SharedState | None) -> SharedStatus | None:
    if shared is None:
        return None
    s3 = shared.s3
    pid = s3.child.pid if s3.child is not None else 0
    return SharedStatus(
        postgres_host=shared.postgres.host,
        postgres_port=shared.postgres.port,
        s3_endpoint=s3.endpoint,
        bucket=shared.bucket,
        s3_pid=pid,
    )


def _secure_status(secure: SecureFleet | None) -> SecureStatus | None:
    if secure is None:
        return None
    return SecureStatus(
        ca_file=str(secure.ca_file),
        admin_token_file=str(secure.admin_token_file),
        client_cert_file=str(secure.operator_tls.cert_file),
        client_key_file=str(secure.operator_tls.key_file),
    )
