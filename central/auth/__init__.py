"""Who may call central: hashed bearer tokens with roles. Operator tokens (``admin``,
``viewer``) and the middleware that enforces them on the REST API; node tokens (``node``,
bound to one node id) and the guard that enforces them on the gRPC Registry API. The token
stores themselves are in ``central.storage``."""

from __future__ import annotations

from central.auth.middleware import ANONYMOUS, OperatorAuth, actor_of
from central.auth.nodes import NodeGuard
from central.auth.tokens import OPERATOR_ROLES, Role, TokenRecord, TokenStoreError

__all__ = [
    "ANONYMOUS",
    "OPERATOR_ROLES",
    "NodeGuard",
    "OperatorAuth",
    "Role",
    "TokenRecord",
    "TokenStoreError",
    "actor_of",
]
