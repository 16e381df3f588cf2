"""``modelfleet node-token create|list|revoke``: each edge's credential for central's gRPC
Registry API (enforced with ``auth.nodes_required``).

Like ``modelfleet token``, it runs on central's host against its data directory; the store
(``node_tokens.json``, apart from the operator tokens) holds only hashes, each bound to one
node id, so a token is printed once. Central picks changes up without a restart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from modelfleet.cli import output
from modelfleet.cli.client import CliError, UsageError
from modelfleet.cli.config import JsonOption
from modelfleet.cli.token import DataDirOption

if TYPE_CHECKING:
    from central.storage.protocols import Tokens

node_token_app = typer.Typer(
    no_args_is_help=True, help="Create, list and revoke edge nodes' credentials for central's gRPC Registry."
)

NodeTokensFileOption = Annotated[
    Path | None,
    typer.Option(
        "--node-tokens-file",
        help="The node token store, when central's auth.node_tokens_file is set.",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``node-token`` to ``app``."""
    app.add_typer(node_token_app, name="node-token")


def _store(data_dir: Path, node_tokens_file: Path | None) -> Tokens:
    """The file in the data dir, or PostgreSQL when central's ``MODELFLEET_STORE__URL`` is set."""
    from central.settings import AuthSettings
    from central.storage.tokens import open_token_store

    path = AuthSettings(node_tokens_file=node_tokens_file).node_tokens_path(data_dir)
    return open_token_store(os.environ.get("MODELFLEET_STORE__URL") or None, path, "node")


@node_token_app.command("create")
@output.reported
def create(
    node: Annotated[str, typer.Option("--node", help="The node id the token is bound to (the edge's node_id).")],
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="A unique name; default: the node id (give another to rotate).", show_default=False
        ),
    ] = None,
    data_dir: DataDirOption = Path("./data/central"),
    node_tokens_file: NodeTokensFileOption = None,
) -> None:
    """Create a node's token and print it once (only its hash is stored)."""
    from central.auth import Role, TokenStoreError
    from fleetwire.names import InvalidName, check_name

    try:
        check_name("node id", node)
    except InvalidName as exc:
        raise UsageError(str(exc)) from None
    store = _store(data_dir, node_tokens_file)
    try:
        token = store.create(name or node, Role.NODE, node_id=node)
    except TokenStoreError as exc:
        raise CliError(str(exc)) from None
    print(token)  # alone on stdout: `modelfleet node-token create --node a > /etc/modelfleet/node-token`
    typer.echo(
        f"created node token {name or node!r} for node {node!r} in {store.location}; it is not shown again", err=True
    )


@node_token_app.command("list")
@output.reported
def list_tokens(
    json: JsonOption = False,
    data_dir: DataDirOption = Path("./data/central"),
    node_tokens_file: NodeTokensFileOption = None,
) -> None:
    """Names, node ids and creation times of the stored node tokens (never the tokens)."""
    records = _store(data_dir, node_tokens_file).records()
    if json:
        output.print_json([{"name": r.name, "node_id": r.node_id, "created_at": r.created_at} for r in records])
        return
    rows = [(r.name, r.node_id or "-", r.created_at) for r in records]
    output.console().print(output.table(("name", "node", "created"), rows, title="node tokens"))


@node_token_app.command("revoke")
@output.reported
def revoke(
    node: Annotated[
        str | None, typer.Option("--node", help="Revoke every token of this node.", show_default=False)
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Revoke the token of this name.", show_default=False)
    ] = None,
    data_dir: DataDirOption = Path("./data/central"),
    node_tokens_file: NodeTokensFileOption = None,
) -> None:
    """Remove a node's tokens; central refuses them from the node's next call on."""
    from central.auth import TokenStoreError

    if (node is None) == (name is None):
        raise UsageError("give --node (all of a node's tokens) or --name (one token)")
    store = _store(data_dir, node_tokens_file)
    try:
        if node is not None:
            gone = store.revoke_node(node)
        else:
            store.revoke(str(name))
            gone = [str(name)]
    except TokenStoreError as exc:
        raise CliError(str(exc)) from None
    output.console().print(f"revoked node token(s) {', '.join(repr(n) for n in gone)}")
