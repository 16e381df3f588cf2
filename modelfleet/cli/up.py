"""``modelfleet up``: options → ``UpOptions`` → ``run_up``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from modelfleet.cli._common import build_settings, overrides


def register(app: typer.Typer) -> None:
    """Add ``up`` to ``app``."""
    app.command()(up)


def up(
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the fleet keeps registry, caches and logs. Default: .modelfleet")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Exit (0 only if every step worked) instead of running on.")
    ] = False,
    json_status: Annotated[
        Path | None, typer.Option(help="Write URLs, ports and pids to this JSON file once the fleet is up.")
    ] = None,
    base_port: Annotated[
        int | None,
        typer.Option(
            help="Central HTTP on this port, edges on the next ones, gRPC at +10, broker at +20; 0: any free ports."
            " Default: 8080, 8081…, 50051, 1883 (free ones where taken)."
        ),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(
            envvar="MODELFLEET_UP_BROKER", help="auto (Mosquitto if installed), mosquitto or amqtt. Default: auto."
        ),
    ] = None,
    edges: Annotated[int | None, typer.Option(help="How many edges. Default: 3.")] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Hardened: private CA, TLS everywhere (mutual between edges), operator and node tokens,"
            " MQTT logins + ACL over TLS. Needs Mosquitto.",
        ),
    ] = False,
    ha: Annotated[
        bool,
        typer.Option(
            "--ha",
            help="Central as three replicas sharing a private PostgreSQL and a local S3 server;"
            " edges get all three addresses. Needs the ha extra and PostgreSQL (make up UP_ARGS=--ha installs both).",
        ),
    ] = False,
) -> None:
    """Start a local fleet (broker, central, edges), push the digits model, try it; Ctrl-C stops it all."""
    from modelfleet.up import Steps, UpOptions, run_up

    o = overrides(
        data_dir=data_dir,
        once=once,
        json_status=json_status,
        base_port=base_port,
        broker=broker,
        edges=edges,
        secure=secure,
        ha=ha,
    )
    options = build_settings(UpOptions, o)
    raise typer.Exit(run_up(options, Steps(Console(highlight=False, soft_wrap=True))))
