"""What the gateway may say about models no node serves, and to whom.

A model that is pushed but served by no node (never activated, or not yet out) is described
from central's registry (versions, tensor signatures) so a client can prepare. With
``auth.protect_reads`` that description is registry metadata like any other read: it goes to
callers showing an operator token, and an anonymous caller gets the same 404 as for a name
that does not exist, so the gateway is no oracle of what is stored. Models some node serves are
answered by that node, to anyone, as the gateway is open by design."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from central.gateway.candidates import ModelCatalog

__all__ = ["GatedCatalog"]


class GatedCatalog:
    """The registry's ``describe``, for every caller or (``is_reader`` set) for readers only."""

    def __init__(
        self, describe: ModelCatalog, is_reader: Callable[[str | None], Awaitable[bool]] | None = None
    ) -> None:
        """``is_reader(token)``: whether a bearer token (None: none shown) is an operator's;
        None: reads are open, everyone is described everything stored."""
        self._describe = describe
        self._is_reader = is_reader

    async def for_caller(self, token: str | None) -> ModelCatalog | None:
        """The catalog this caller may read, or None (it is told only what nodes serve)."""
        if self._is_reader is None or await self._is_reader(token):
            return self._describe
        return None
