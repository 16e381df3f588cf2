"""Running the ``modelfleet`` CLI against a real central in the test's event loop.

The CLI is synchronous (httpx.Client); it runs in a worker thread through
``asyncio.to_thread`` so that the central serving it keeps running on the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner, Result

from modelfleet.cli import app


class Cli:
    """Invokes the CLI with an isolated configuration (no ~/.config file, a wide console)."""

    def __init__(self, tmp_path: Path, central_url: str | None = None) -> None:
        config = tmp_path / "cli-config.toml"
        config.write_text("", encoding="utf-8")
        self.env = {"MODELFLEET_CONFIG": str(config), "COLUMNS": "220", "MODELFLEET_TOKEN": ""}
        if central_url is not None:
            self.env["MODELFLEET_CENTRAL_URL"] = central_url

    async def __call__(self, *args: str) -> Result:
        """Run ``modelfleet ARGS``; an exception that is not an exit fails the test (a traceback)."""
        result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=self.env)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result


def one_error_line(result: Result) -> str:
    """The single ``error: …`` line on stderr, asserting there is exactly one line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {result.stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]
