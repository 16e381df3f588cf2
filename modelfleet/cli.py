"""The ``modelfleet`` command. It only turns options into settings and starts a server;
options left out fall back to ``MODELFLEET_…`` environment variables, then defaults."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Distribute ONNX models to a fleet of edges.")
err = Console(stderr=True)


def _overrides(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run a server on uvloop where it installs (faster HTTP), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _broker(value: str | None) -> tuple[str, int] | None:
    """``host:port`` of the MQTT broker; exit 2 with a clear line when malformed."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        err.print(f"[red]--broker must be host:port, got {value!r}[/red]")
        raise typer.Exit(2)
    return host, int(port)


def _settings(cls: Any, overrides: dict[str, Any]) -> Any:
    try:
        return cls(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        err.print(f"[red]invalid setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}[/red]")
        raise typer.Exit(2) from None


@app.command()
def central(
    data_dir: Annotated[Path | None, typer.Option(help="Registry data directory.")] = None,
    http_port: Annotated[int | None, typer.Option(help="REST port (0: any free).")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0: any free).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address for both servers.")] = None,
    broker: Annotated[str | None, typer.Option(help="MQTT broker host:port for heartbeats.")] = None,
) -> None:
    """Start central: registry REST API, gateway and gRPC Registry service."""
    from central.server import serve
    from central.settings import CentralSettings

    o = _overrides(data_dir=data_dir, http_port=http_port, grpc_port=grpc_port, http_host=host, grpc_host=host)
    if (b := _broker(broker)) is not None:
        o["mqtt"] = {"host": b[0], "port": b[1]}
    settings = _settings(CentralSettings, o)
    _logging(settings.log_level)
    _run(serve(settings))


@app.command()
def edge(
    node_id: Annotated[str | None, typer.Option(help="Unique node id.")] = None,
    central: Annotated[str | None, typer.Option(help="Central's gRPC address host:port.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Edge data directory.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Shared chunk cache directory.")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="Peer gRPC port (0: any free).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0: any free).")] = None,
    capacity: Annotated[int | None, typer.Option(help="Relative share of chunks to own.")] = None,
    broker: Annotated[str | None, typer.Option(help="MQTT broker host:port for heartbeats.")] = None,
) -> None:
    """Start an edge: follow central, fetch and verify chunks, serve peers."""
    from edge_node.server import serve
    from edge_node.settings import EdgeSettings

    o = _overrides(
        node_id=node_id,
        central=central,
        data_dir=data_dir,
        cache_dir=cache_dir,
        grpc_port=grpc_port,
        http_port=http_port,
        capacity=capacity,
    )
    if (b := _broker(broker)) is not None:
        o["heartbeat"] = {"broker_host": b[0], "broker_port": b[1]}
    settings = _settings(EdgeSettings, o)
    _logging(settings.log_level)
    _run(serve(settings))


def main() -> int:
    """Entry point of the console script."""
    try:
        app()
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 1
    return 0
