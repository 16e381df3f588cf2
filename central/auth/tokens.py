"""API tokens: roles, the stored record (a token's *hash*, its name and role), and how a token
is made and hashed. The stores (a JSON file, or PostgreSQL) are in ``central.storage``.

Only ``sha256(token)`` is stored. A slow password hash (bcrypt, scrypt) is not needed:
tokens are 32 random bytes from ``secrets`` (256 bits), so a stolen file cannot be
brute-forced back to a token, and a fast hash keeps each request's check cheap. The
plaintext is shown once, by ``modelfleet token create``, and never written anywhere."""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from central.storage.protocols import Tokens

#: Marks modelfleet tokens (easy to spot in a leaked log or a secret scanner).
TOKEN_PREFIX = "mft_"


class Role(StrEnum):
    """What a token may do: ``admin`` reads and writes, ``viewer`` only reads (both on the
    REST API); ``node`` is one edge's identity on the gRPC Registry API and nothing else."""

    ADMIN = "admin"
    VIEWER = "viewer"
    NODE = "node"


#: The roles of operator tokens (the REST API's store).
OPERATOR_ROLES = frozenset({Role.ADMIN, Role.VIEWER})


class TokenRecord(BaseModel):
    """One stored token: never the token itself, only its hash."""

    name: str
    role: Role
    sha256: str
    created_at: str
    node_id: str | None = None  # set for role ``node``: the only node id the token may act as


class TokenStoreError(Exception):
    """A token operation the operator asked for that cannot be done (duplicate or unknown name)."""


def hash_token(token: str) -> str:
    """The stored form of ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh high-entropy token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


#: Which of central's two token stores: operator tokens (REST) or node tokens (gRPC).
TokenKind = Literal["operator", "node"]


def check_binding(role: Role, node_id: str | None) -> None:
    """A ``node`` token is bound to one node id; other roles have none."""
    if (role == Role.NODE) != (node_id is not None):
        raise TokenStoreError("a node token needs a node id, and only a node token has one")


def operator_record(store: Tokens, token: str | None) -> TokenRecord | None:
    """The record of an operator token (any role) in ``store``; None for no token, an unknown
    or revoked one, or a node credential (even one copied into this store by hand)."""
    record = store.verify(token) if token is not None else None
    return record if record is not None and record.role in OPERATOR_ROLES else None
