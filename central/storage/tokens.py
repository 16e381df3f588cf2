"""Opens one of central's token stores: a JSON file, or PostgreSQL with ``store.url``. Its own
small module so that the CLI (``modelfleet token``) opens a store without loading the rest."""

from __future__ import annotations

from pathlib import Path

from central.auth.tokens import TokenKind
from central.storage.files.tokens import TokenStore
from central.storage.protocols import Tokens

__all__ = ["open_token_store"]


def open_token_store(url: str | None, path: Path, kind: TokenKind, *, connect_timeout_s: float = 10.0) -> Tokens:
    """The ``kind`` tokens on PostgreSQL when ``url`` (``store.url``) is set, else in the file ``path``."""
    if url is None:
        return TokenStore(path)
    from central.storage.postgres.tokens import PostgresTokenStore  # the [postgres] extra

    return PostgresTokenStore(url, kind, connect_timeout_s=connect_timeout_s)
