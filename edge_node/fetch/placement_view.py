"""This node's latest view of chunk owners, peer addresses and peer sites, from desired
state.

The fetcher re-reads it on every attempt, so a placement change (an owner died)
redirects fetches that are already retrying."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fleetwire.transfer import DEFAULT_SITE


class PlacementView:
    """digest → owners and size, node id → gRPC address and site."""

    def __init__(self, site: str = DEFAULT_SITE) -> None:
        """``site``: where this node is (its setting), for ``same_site_first``."""
        self.site = site
        self._owners: dict[str, list[str]] = {}
        self._sizes: dict[str, int] = {}
        self._updated = asyncio.Event()
        self._peers: dict[str, str] = {}
        self._sites: dict[str, str] = {}
        self.placement_enabled = True

    def update(
        self,
        owners: dict[str, list[str]],
        peers: dict[str, str],
        placement_enabled: bool,
        sizes: dict[str, int] | None = None,
        sites: dict[str, str] | None = None,
    ) -> None:
        """Replace the view with a new desired state's (``sizes``: digest → bytes, from its
        manifests; ``sites``: node id → site of every peer)."""
        self._owners = owners
        self._sizes = sizes or {}
        self._sites = sites or {}
        updated, self._updated = self._updated, asyncio.Event()
        updated.set()  # wakes whoever waits in changed(); later waiters wait for the next update
        self._peers = peers
        self.placement_enabled = placement_enabled

    def owners(self, digest: str) -> list[str]:
        """Owners of ``digest`` in placement order ([] when unknown)."""
        return self._owners.get(digest, [])

    async def changed(self) -> None:
        """Return at the next ``update``."""
        await self._updated.wait()

    def size(self, digest: str) -> int | None:
        """The chunk's size from a manifest of the desired state, or None when unknown."""
        return self._sizes.get(digest)

    def address(self, node_id: str) -> str | None:
        """gRPC address of a peer, or None when it is not in the fleet."""
        return self._peers.get(node_id)

    def site_of(self, node_id: str) -> str:
        """A peer's site (``DEFAULT_SITE`` when central named none)."""
        return self._sites.get(node_id, DEFAULT_SITE)

    def same_site_first(self, nodes: Sequence[str]) -> list[str]:
        """``nodes`` in this node's site, then the others, each group in the given order:
        a chunk crosses the link between sites only when no peer inside has it."""
        return sorted(nodes, key=lambda n: self.site_of(n) != self.site)  # stable: order kept within each

    def owned_by(self, node_id: str) -> set[str]:
        """Digests ``node_id`` owns."""
        return {d for d, owners in self._owners.items() if node_id in owners}
