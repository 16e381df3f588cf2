"""Who may call central: hashed bearer tokens with roles. Operator tokens (``admin``,
``viewer``; the REST API's middleware, ``central.rest.auth``, enforces them) and node tokens
(``node``, bound to one node id) with the guard the gRPC Registry API runs. The token stores
themselves are in ``central.storage``."""

from __future__ import annotations

from central.auth.nodes import NodeGuard
from central.auth.tokens import OPERATOR_ROLES, Role, TokenRecord, TokenStoreError

__all__ = [
    "OPERATOR_ROLES",
    "NodeGuard",
    "Role",
    "TokenRecord",
    "TokenStoreError",
]
