"""The ``modelfleet`` command. Each subcommand family lives in its own module and adds
itself to ``app`` through ``register``; the service commands only turn options into
settings and start a server."""

from __future__ import annotations

import sys

import typer

# typer carries its own copy of click (pinned in pyproject): its usage errors come from there.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from modelfleet.cli import doctor, keys, node_token, operator, pki, push, rollout, services, token, up, zoo

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Distribute ONNX models to a fleet of edges.")

for _module in (services, up, push, operator, rollout, doctor, zoo, token, node_token, keys, pki):
    _module.register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: 0 ok, 1 failure, 2 usage. A usage error is one
    line on stderr (not click's framed panel), like every other error of the CLI."""
    try:
        result = app(args=argv, prog_name="modelfleet", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        sys.stdout.write(exc.format_message() + "\n")
        return 2
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "modelfleet"
        sys.stderr.write(f"error: {exc.format_message()} (see '{where} --help')\n")
        return 2
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("aborted\n")
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 1
    return result if isinstance(result, int) else 0
