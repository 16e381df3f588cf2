"""``modelfleet token create|list|revoke``: the operator tokens of central's REST API.

Run on central's host against its data directory: the store holds only hashes, so a
token is printed once, at creation, and cannot be shown again (revoke and create a new
one instead). Central picks changes up without a restart. ``central`` is imported inside
the commands so that the rest of the CLI starts without it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from modelfleet.cli import output
from modelfleet.cli.client import CliError, UsageError
from modelfleet.cli.config import JsonOption

if TYPE_CHECKING:
    from central.storage.protocols import Tokens

token_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke operator API tokens.")

DataDirOption = Annotated[
    Path,
    typer.Option(
        "--data-dir", envvar="MODELFLEET_DATA_DIR", help="Central's data directory (tokens, node tokens, manifest key)."
    ),
]
TokensFileOption = Annotated[
    Path | None,
    typer.Option("--tokens-file", help="The token store, when central's auth.tokens_file is set.", show_default=False),
]
NameOption = Annotated[str, typer.Option("--name", help="Who or what holds the token (unique).")]


def register(app: typer.Typer) -> None:
    """Add ``token`` to ``app``."""
    app.add_typer(token_app, name="token")


def _store(data_dir: Path, tokens_file: Path | None) -> Tokens:
    """The file in the data dir, or PostgreSQL when central's ``MODELFLEET_STORE__URL`` is set."""
    from central.settings import AuthSettings
    from central.storage.tokens import open_token_store

    path = AuthSettings(tokens_file=tokens_file).tokens_path(data_dir)
    return open_token_store(os.environ.get("MODELFLEET_STORE__URL") or None, path, "operator")


@token_app.command("create")
@output.reported
def create(
    name: NameOption,
    role: Annotated[str, typer.Option("--role", help="admin (read and write) or viewer (read only).")],
    data_dir: DataDirOption = Path("./data/central"),
    tokens_file: TokensFileOption = None,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from central.auth import OPERATOR_ROLES, Role, TokenStoreError

    if role not in {r.value for r in OPERATOR_ROLES}:  # node tokens: `modelfleet node-token`
        raise UsageError(f"--role must be admin or viewer, got {role!r}")
    store = _store(data_dir, tokens_file)
    try:
        token = store.create(name, Role(role))
    except TokenStoreError as exc:
        raise CliError(str(exc)) from None
    print(token)  # alone on stdout, so that `TOKEN=$(modelfleet token create …)` works
    typer.echo(f"created {role} token {name!r} in {store.location}; it is not shown again", err=True)


@token_app.command("list")
@output.reported
def list_tokens(
    json: JsonOption = False, data_dir: DataDirOption = Path("./data/central"), tokens_file: TokensFileOption = None
) -> None:
    """Names, roles and creation times of the stored tokens (never the tokens)."""
    records = _store(data_dir, tokens_file).records()
    if json:
        output.print_json([{"name": r.name, "role": str(r.role), "created_at": r.created_at} for r in records])
        return
    rows = [(r.name, str(r.role), r.created_at) for r in records]
    output.console().print(output.table(("name", "role", "created"), rows, title="operator tokens"))


@token_app.command("revoke")
@output.reported
def revoke(
    name: NameOption, data_dir: DataDirOption = Path("./data/central"), tokens_file: TokensFileOption = None
) -> None:
    """Remove a token; central refuses it from its next request on."""
    from central.auth import TokenStoreError

    store = _store(data_dir, tokens_file)
    try:
        store.revoke(name)
    except TokenStoreError as exc:
        raise CliError(str(exc)) from None
    output.console().print(f"revoked token {name!r}")
