"""``modelfleet central`` and ``modelfleet edge``: options → settings → server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelfleet.cli._common import build_settings, overrides, parse_broker, print_error, run_server, setup_logging


def register(app: typer.Typer) -> None:
    """Add the service commands to ``app``."""
    app.command()(central)
    app.command()(edge)


def central(
    data_dir: Annotated[Path | None, typer.Option(help="Registry data directory.")] = None,
    http_port: Annotated[int | None, typer.Option(help="REST port (0: any free).")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0: any free).")] = None,
    infer_grpc_port: Annotated[
        int | None, typer.Option(help="Gateway's KServe v2 gRPC inference port (0: any free).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address for both servers.")] = None,
    broker: Annotated[str | None, typer.Option(help="MQTT broker host:port for heartbeats.")] = None,
    replica_id: Annotated[
        str | None, typer.Option(help="Run as one replica of a replicated central (needs store.url).")
    ] = None,
) -> None:
    """Start central: registry REST API, gateway and gRPC Registry service."""
    from central.server import serve
    from central.settings import CentralSettings

    o = overrides(data_dir=data_dir, http_port=http_port, grpc_port=grpc_port, http_host=host, grpc_host=host)
    if (b := parse_broker(broker)) is not None:
        o["broker"] = {"host": b[0], "port": b[1]}
    if replica_id is not None:
        o["ha"] = {"replica_id": replica_id}
    if infer_grpc_port is not None:
        o["gateway"] = {"grpc_port": infer_grpc_port}
    settings = build_settings(CentralSettings, o)
    setup_logging(settings.log_level)
    run_server(serve(settings))


def edge(
    node_id: Annotated[str | None, typer.Option(help="Unique node id.")] = None,
    central: Annotated[
        str | None,
        typer.Option(help="Central's gRPC address host:port, or several: host1:port1,host2:port2 (failover)."),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Edge data directory.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Shared chunk cache directory.")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="Peer gRPC port (0: any free).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0: any free).")] = None,
    infer_grpc_port: Annotated[int | None, typer.Option(help="KServe v2 gRPC inference port (0: any free).")] = None,
    capacity: Annotated[int | None, typer.Option(help="Relative share of chunks to own.")] = None,
    broker: Annotated[str | None, typer.Option(help="MQTT broker host:port for heartbeats.")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="key=value label announced to central (repeatable).")
    ] = None,
) -> None:
    """Start an edge: follow central, fetch and verify chunks, serve peers."""
    from edge_node.server import serve
    from edge_node.settings import EdgeSettings

    o = overrides(
        node_id=node_id,
        central=central,
        data_dir=data_dir,
        cache_dir=cache_dir,
        grpc_port=grpc_port,
        http_port=http_port,
        infer_grpc_port=infer_grpc_port,
        capacity=capacity,
    )
    if (b := parse_broker(broker)) is not None:
        o["broker"] = {"host": b[0], "port": b[1]}
    if label:
        o["labels"] = parse_labels(label)
    settings = build_settings(EdgeSettings, o)
    setup_logging(settings.log_level)
    run_server(serve(settings))


def parse_labels(values: list[str]) -> dict[str, str]:
    """``["zone=a", "tier=gpu"]`` → a dict; exit 2 with a clear line on a malformed pair
    (rollout selectors match these labels)."""
    labels: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key.strip():
            print_error(f"[red]--label must be key=value, got {value!r}[/red]")
            raise typer.Exit(2)
        labels[key.strip()] = item.strip()
    return labels
