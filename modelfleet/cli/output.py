"""How the operator commands talk back: rich tables for people, ``--json`` for scripts,
and one ``error: …`` line on stderr for every failure (exit 1; exit 2 for usage).

Commands are wrapped in ``reported`` so that no ``CliError`` ever reaches typer as a
traceback: scripts can rely on the exit code and people on one readable line."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from modelfleet.cli.client import CliError, UsageError
from modelfleet.cli.config import ConfigError
from modelfleet.extras import MissingExtra

P = ParamSpec("P")
R = TypeVar("R")

EXIT_FAILURE = 1
EXIT_USAGE = 2


def console() -> Console:
    """Standard output for people (created per call: tests swap ``sys.stdout``)."""
    return Console(file=sys.stdout, highlight=False)


def error_line(message: str) -> None:
    """``error: …`` on stderr, one line, no markup interpretation."""
    flat = " ".join(message.split())
    sys.stderr.write(f"error: {flat}\n")
    sys.stderr.flush()


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Report and exit."""
    error_line(message)
    raise typer.Exit(code)


def usage(message: str) -> NoReturn:
    """Report a usage problem and exit 2."""
    fail(message, EXIT_USAGE)


def reported(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the CLI's own errors into one line and the right exit code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (ConfigError, UsageError) as exc:
            usage(str(exc) if isinstance(exc, ConfigError) else exc.message)
        except CliError as exc:
            fail(exc.message)
        except MissingExtra as exc:  # e.g. ``zoo digits`` on a core install
            fail(str(exc))
        except OSError as exc:  # a local file that cannot be read (permissions, vanished mid-upload)
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}")

    return wrapper


def print_json(data: Any) -> None:
    """Indented JSON on stdout (``--json``)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def print_json_line(data: Any) -> None:
    """One compact JSON object per line (``events --follow --json``)."""
    sys.stdout.write(json.dumps(data, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def table(columns: Sequence[str], rows: Iterable[Sequence[str]], title: str | None = None) -> Table:
    """A plain table; the first column never wraps (it is the name people search for)."""
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, column in enumerate(columns):
        t.add_column(column, no_wrap=i == 0)
    for row in rows:
        t.add_row(*row)
    return t


def human_bytes(n: float | None) -> str:
    """``1536`` → ``1.5 KiB``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def age(seconds: float | None) -> str:
    """``75.2`` → ``1m15s ago``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s ago"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s ago"
    return f"{minutes // 60}h{minutes % 60:02d}m ago"


def clock(ts: float | None) -> str:
    """A unix time (seconds or milliseconds) as local ``YYYY-MM-DD HH:MM:SS``."""
    if ts is None:
        return "-"
    seconds = ts / 1000 if ts > 1e11 else ts
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def when(iso: str | None) -> str:
    """Central's ISO-8601 UTC stamps (``2026-12-02T19:25:04.522Z``) to the second."""
    return "-" if not iso else iso.replace("T", " ")[:19] + (" UTC" if iso.endswith("Z") else "")


def percent(fraction: float | None) -> str:
    """``0.9931`` → ``99.3%``."""
    return "-" if fraction is None else f"{fraction:.1%}"


def labels(values: dict[str, str] | None) -> str:
    """``{"zone": "a"}`` → ``zone=a``."""
    return ",".join(f"{k}={v}" for k, v in sorted((values or {}).items())) or "-"
