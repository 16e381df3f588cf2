"""Running the operator CLI against a test central from inside the test's event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from central.server import CentralServer
from modelfleet.cli import app


async def run_cli(tmp_path: Path, central: CentralServer, *args: str) -> str:
    """``modelfleet ARGS`` against ``central`` (in a thread: central serves it on this loop);
    its output, once it exited 0."""
    config = tmp_path / "cli-config.toml"
    config.write_text("", encoding="utf-8")
    env = {"MODELFLEET_CONFIG": str(config), "COLUMNS": "220", "MODELFLEET_TOKEN": "", "MODELFLEET_CENTRAL_URL":
           central.http_url}  # fmt: skip
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return str(result.stdout)
