"""The ``modelfleet`` command. Each subcommand family lives in its own module and adds
itself to ``app`` through ``register``; the service commands only turn options into
settings and start a server."""

from __future__ import annotations

import typer

from modelfleet.cli import doctor, operator, push, rollout, services, up, zoo

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Distribute ONNX models to a fleet of edges.")

for _module in (services, up, push, operator, rollout, doctor, zoo):
    _module.register(app)


def main() -> int:
    """Entry point of the console script."""
    try:
        app()
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 1
    return 0
