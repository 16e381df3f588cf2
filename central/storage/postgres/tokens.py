"""API tokens on PostgreSQL (``store.url``), so every central replica accepts the same tokens
and a revocation holds on all of them at once. Like the file store, only ``sha256(token)``
is stored; the plaintext exists once, in ``create``'s return value. ``api_tokens.kind`` keeps
operator and node tokens apart (the file store's two files). A check is one indexed lookup
by hash: a timing difference could only tell about a hash of 256 random bits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from central.auth.tokens import Role, TokenKind, TokenRecord, TokenStoreError, check_binding, hash_token, new_token
from central.storage.postgres.pool import masked_url, open_pool

_COLUMNS = "name, role, sha256, created_at, node_id"


class PostgresTokenStore:
    """``Tokens`` of one kind on PostgreSQL; thread-safe (each call borrows a pooled connection)."""

    def __init__(self, url: str, kind: TokenKind, *, connect_timeout_s: float = 10.0) -> None:
        self.kind = kind
        self._where = f"{kind} tokens on PostgreSQL {masked_url(url)}"
        self._pool, _ = open_pool(url, name=f"{kind}-tokens", pool_size=2, connect_timeout_s=connect_timeout_s)

    @property
    def location(self) -> str:
        """The database, password masked."""
        return self._where

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def records(self) -> list[TokenRecord]:
        """Every stored token of this kind (hashes, names, roles), by name."""
        rows = self._query(f"SELECT {_COLUMNS} FROM api_tokens WHERE kind = %s ORDER BY name", (self.kind,))
        return [self._record(r) for r in rows]

    def verify(self, token: str) -> TokenRecord | None:
        """The record of ``token`` or None."""
        rows = self._query(
            f"SELECT {_COLUMNS} FROM api_tokens WHERE kind = %s AND sha256 = %s", (self.kind, hash_token(token))
        )
        return self._record(rows[0]) if rows else None

    def create(self, name: str, role: Role, node_id: str | None = None) -> str:
        """Store a new token under ``name`` and return its plaintext (the only time it exists)."""
        check_binding(role, node_id)
        token = new_token()
        created = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            with self._pool.connection() as conn:
                conn.execute(
                    f"INSERT INTO api_tokens (kind, {_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)",
                    (self.kind, name, role.value, hash_token(token), created, node_id),
                )
        except psycopg.errors.UniqueViolation:
            raise TokenStoreError(f"a token named {name!r} exists already (revoke it first)") from None
        return token

    def revoke(self, name: str) -> None:
        """Remove the token named ``name``."""
        gone = self._query("DELETE FROM api_tokens WHERE kind = %s AND name = %s RETURNING name", (self.kind, name))
        if not gone:
            raise TokenStoreError(f"no token named {name!r} in {self._where}")

    def revoke_node(self, node_id: str) -> list[str]:
        """Remove every token bound to ``node_id``; the names of those removed."""
        gone = self._query(
            "DELETE FROM api_tokens WHERE kind = %s AND node_id = %s RETURNING name", (self.kind, node_id)
        )
        if not gone:
            raise TokenStoreError(f"no token for node {node_id!r} in {self._where}")
        return sorted(r[0] for r in gone)

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            return conn.execute(sql, args).fetchall()

    @staticmethod
    def _record(row: tuple[Any, ...]) -> TokenRecord:
        return TokenRecord(name=row[0], role=Role(row[1]), sha256=row[2], created_at=row[3], node_id=row[4])
