"""Which node is calling central's gRPC Registry API, and whether it may act for the
node id its request names.

With ``auth.nodes_required`` every Registry call carries ``authorization: Bearer <token>``
in its metadata; the token must be a ``node`` token of the node credential store (its own
file, apart from the operator tokens), and it is bound to one node id. A node may register,
watch, unregister and fetch only as itself: a stolen or misconfigured edge cannot take
another node's place on the ring or read another node's desired state. Operator tokens are
not node identities and are refused here, whatever their role."""

from __future__ import annotations

from collections.abc import Iterable

from central.auth.tokens import Role
from central.errors import PermissionDenied, Unauthenticated
from central.storage.offload import INLINE, StoreCalls
from central.storage.protocols import Tokens
from fleetwire.credentials import bearer_from_metadata

_MISSING = "this call needs a node token: metadata 'authorization: Bearer <token>' (see `modelfleet node-token`)"
_UNKNOWN = "unknown or revoked node token"
#: Quoting a client-sent id in a refusal: enough to recognise it, never a huge echo.
_QUOTE = 80


class NodeGuard:
    """The one check every Registry method runs before doing anything."""

    def __init__(self, store: Tokens, calls: StoreCalls = INLINE) -> None:
        """``calls``: where the token look-ups run (worker threads: a PostgreSQL store is a query)."""
        self.store = store
        self._calls = calls

    async def caller(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        """The node id the call's token is bound to; Unauthenticated without a valid one."""
        token = bearer_from_metadata(metadata)
        if token is None:
            raise Unauthenticated(_MISSING)
        record = await self._calls(self.store.verify, token)
        if record is None or record.role != Role.NODE or not record.node_id:
            raise Unauthenticated(_UNKNOWN)
        return record.node_id

    async def authorize(self, metadata: Iterable[tuple[str, str | bytes]] | None, node_id: str | None) -> str:
        """The caller's node id, once it may act as ``node_id`` (None: any node may call;
        empty: the caller itself). PermissionDenied when the ids differ."""
        caller = await self.caller(metadata)
        if node_id and node_id != caller:
            raise PermissionDenied(
                f"this node's token is bound to node {caller!r}; it may not act as node {node_id[:_QUOTE]!r}"
            )
        return caller
