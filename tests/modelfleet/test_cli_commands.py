"""``modelfleet`` builds only the family of the command it runs; the command table it
uses for that matches what the families register, so no command goes missing."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from modelfleet.cli import COMMANDS, FAMILIES, build_app


def _commands(app: typer.Typer) -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.main.TyperGroup)
    return set(group.commands)


def test_command_table_matches_the_families() -> None:
    assert _commands(build_app()) == set(COMMANDS)
    assert set(COMMANDS.values()) == set(FAMILIES)
    for family in FAMILIES:
        assert _commands(build_app((family,))) == {c for c, f in COMMANDS.items() if f == family}, family


def test_edge_command_leaves_other_families_unimported() -> None:
    code = (
        "import sys; from modelfleet.cli import main; rc = main(['edge', '--help']);"
        "print(rc, sorted(m for m in sys.modules if m.startswith('modelfleet.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 ['modelfleet.cli._common', 'modelfleet.cli.services']"


def test_the_edge_server_module_leaves_the_http_stack_for_later() -> None:
    """FastAPI and uvicorn load in a worker thread while a restarted edge loads its models
    (edge_node.server); an import of them on the way to the server module would undo that."""
    code = (
        "import sys, edge_node.server;print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
