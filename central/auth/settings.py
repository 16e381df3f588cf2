"""Settings of operator API authentication and of node credentials (central's ``auth`` section).

Off by default: ``modelfleet up``, the CLI and existing deployments use the API without
tokens; turning it on is an explicit operator decision (``MODELFLEET_AUTH__ENABLED=true``).
Node credentials on the gRPC Registry API are a separate switch (``nodes_required``): edges
need a token each before it can be turned on."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

#: Where the token store lives when ``tokens_file`` is not set, relative to ``data_dir``.
DEFAULT_TOKENS_FILENAME = "tokens.json"
#: Where the node credential store lives when ``node_tokens_file`` is not set.
DEFAULT_NODE_TOKENS_FILENAME = "node_tokens.json"


class AuthSettings(BaseModel):
    """Bearer tokens with roles on central's REST API; per-node tokens on its gRPC Registry API."""

    enabled: bool = Field(False, description="Require an admin token for every write under /api/v1.")
    tokens_file: Path | None = Field(
        None, description="The hashed token store; default <data_dir>/tokens.json (see `modelfleet token`)."
    )
    protect_reads: bool = Field(
        False, description="Also require a token (any role) for reads: GET /api/v1, /metrics, the dashboard."
    )

    nodes_required: bool = Field(
        False,
        description=(
            "Require every call to the gRPC Registry API to carry a node token (`modelfleet node-token`)"
            " and to act only for the node that token is bound to."
        ),
    )
    node_tokens_file: Path | None = Field(
        None, description="The hashed node credential store; default <data_dir>/node_tokens.json."
    )

    def node_tokens_path(self, data_dir: Path) -> Path:
        """The node credential store's path for a central whose data directory is ``data_dir``."""
        return self.node_tokens_file if self.node_tokens_file is not None else data_dir / DEFAULT_NODE_TOKENS_FILENAME

    def tokens_path(self, data_dir: Path) -> Path:
        """The token store's path for a central whose data directory is ``data_dir``."""
        return self.tokens_file if self.tokens_file is not None else data_dir / DEFAULT_TOKENS_FILENAME
