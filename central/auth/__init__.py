"""Operator API authentication: hashed bearer tokens with roles (``admin``, ``viewer``)
and the middleware that enforces them on central's REST API."""

from __future__ import annotations

from central.auth.middleware import OperatorAuth
from central.auth.settings import AuthSettings
from central.auth.tokens import Role, TokenRecord, TokenStore, TokenStoreError

__all__ = ["AuthSettings", "OperatorAuth", "Role", "TokenRecord", "TokenStore", "TokenStoreError"]
