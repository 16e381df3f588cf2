"""The ``modelfleet`` command. Each subcommand family lives in its own module and adds
itself to the app through ``register``; the service commands only turn options into
settings and start a server.

``main`` imports only the module of the command it runs: ``modelfleet edge`` is how an
edge (re)starts, and importing every family (``doctor`` alone pulls in httpx, rich tables
and the wire models) cost it about a fifth of a second before it could serve. Help, a
missing or unknown command and ``app`` (the whole command, for tests) import them all."""

from __future__ import annotations

import importlib
import sys
from functools import cache

import typer

# typer carries its own copy of click (pinned in pyproject): its usage errors come from there.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

__all__ = ["COMMANDS", "FAMILIES", "app", "build_app", "main"]

#: The subcommand families, in the order ``--help`` lists them.
FAMILIES = (
    "services", "up", "push", "operator", "rollout", "generate", "doctor", "zoo", "token", "node_token", "keys", "pki",
)  # fmt: skip

#: Each top-level command and the family (module of this package) that adds it;
#: ``tests/modelfleet/test_cli_commands.py`` checks it against what the families register.
COMMANDS: dict[str, str] = {
    "central": "services", "edge": "services", "up": "up", "push": "push",
    "models": "operator", "nodes": "operator", "events": "operator",
    "rollout": "rollout", "rollouts": "rollout", "promote": "rollout", "rollback": "rollout",
    "flip": "rollout", "retry": "rollout", "generate": "generate", "chat": "generate",
    "doctor": "doctor", "zoo": "zoo", "token": "token", "node-token": "node_token", "keys": "keys", "pki": "pki",
}  # fmt: skip

_HELP = "Distribute ONNX models to a fleet of edges."


def _root() -> None:
    """Distribute ONNX models to a fleet of edges."""


@cache
def build_app(families: tuple[str, ...] = FAMILIES) -> typer.Typer:
    """The ``modelfleet`` command with the commands of ``families`` (all by default)."""
    built = typer.Typer(add_completion=False, no_args_is_help=True, help=_HELP)
    # A callback keeps it a group even when one family adds a single command (``up``):
    # otherwise typer would run that command for any command line.
    built.callback()(_root)
    for family in families:
        importlib.import_module(f"{__name__}.{family}").register(built)
    return built


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole command, built on first use (see the module docstring)."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(argv: list[str]) -> typer.Typer:
    """The app with only the family of the command ``argv`` starts with (the root has no
    options but ``--help``), else the whole one, which answers help and errors."""
    family = COMMANDS.get(argv[0]) if argv else None
    return build_app() if family is None else build_app((family,))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: 0 ok, 1 failure, 2 usage. A usage error is one
    line on stderr (not click's framed panel), like every other error of the CLI."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = _app_for(args)(args=args, prog_name="modelfleet", standalone_mode=False)
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
