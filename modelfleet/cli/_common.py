"""Helpers shared by the ``modelfleet`` subcommands: settings from options, the event
loop, logging and the one-line error convention (exit 2 for usage, 1 for failure)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import typer
from pydantic import ValidationError


def print_error(markup: str) -> None:
    """One line of rich markup on stderr. rich is imported here, on an error only: the
    service commands start every edge and central, and rich is a share of their start."""
    from rich.console import Console

    Console(stderr=True).print(markup)


def overrides(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def run_server(main: Coroutine[Any, Any, None]) -> None:
    """Run a server on uvloop where it installs (faster HTTP), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def parse_broker(value: str | None) -> tuple[str, int] | None:
    """``host:port`` of the MQTT broker; exit 2 with a clear line when malformed."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        print_error(f"[red]--broker must be host:port, got {value!r}[/red]")
        raise typer.Exit(2)
    return host, int(port)


def build_settings(cls: Any, overrides: dict[str, Any]) -> Any:
    try:
        return cls(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        print_error(f"[red]invalid setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}[/red]")
        raise typer.Exit(2) from None
