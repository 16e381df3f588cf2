"""``TransferPolicy``: the chunk byte-rate caps central sends each edge in its desired state.

Per cap, a node's own entry wins over its site's, which wins over the fleet's; a cap
none of them sets stays unset and the edge keeps its own setting. ``replace`` swaps the
whole policy (``PUT /api/v1/transfer``) and calls ``on_change``, which re-sends every
node its desired state, so a change reaches every connected edge at once.

The policy starts from the ``transfer`` settings; a ``replace`` is kept (``DecisionRecords``,
kind ``transfer``) and wins over them from then on, so a restart keeps it and, on a replicated
central, every replica takes it at its next read (the write bumps the fleet generation). Two
operators replacing it at once: the later write wins, as for any ``PUT``. The write is awaited
through ``StoreCalls`` (a worker thread), so the route never holds the event loop on the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from central.settings import TransferSettings
from central.storage.memory import MemoryDecisionRecords
from central.storage.offload import INLINE, StoreCalls
from central.storage.protocols import DecisionRecords
from fleetwire.transfer import DEFAULT_SITE, TransferCaps

#: The ``DecisionRecords`` kind, and the one key of it.
KIND, KEY = "transfer", "policy"


class TransferPolicy:
    """Fleet, per-site and per-node caps; ``caps_for(node_id)`` resolves one node's."""

    def __init__(
        self,
        settings: TransferSettings,
        site_of: Callable[[str], str | None],
        on_change: Callable[[], None] = lambda: None,
        records: DecisionRecords | None = None,
        calls: StoreCalls = INLINE,
    ) -> None:
        """``site_of(node_id)``: the site a node registered with (None: not registered);
        ``records``: where a replaced policy is kept (None: memory only); ``calls``: where its
        write runs (central's worker threads; inline by default)."""
        self._calls = calls
        self._settings = settings
        self._site_of = site_of
        self._on_change = on_change
        self._records: DecisionRecords = records if records is not None else MemoryDecisionRecords()
        self.reload()

    def reload(self) -> None:
        """Take the stored policy, if an operator ever replaced it."""
        self.adopt(self.read_stored())

    def read_stored(self) -> dict[str, Any] | None:
        """The stored policy, None if never replaced (a store read: any thread)."""
        stored = self._records.load(KIND).get(KEY)
        return dict(stored) if stored is not None else None

    def adopt(self, stored: dict[str, Any] | None) -> None:
        """Put what ``read_stored`` read in force (on the loop)."""
        if stored is not None:
            self._settings = TransferSettings.model_validate(stored)

    @property
    def settings(self) -> TransferSettings:
        """The policy in force."""
        return self._settings

    async def replace(self, settings: TransferSettings) -> None:
        """Store ``settings`` (in a worker thread), put them in force and re-send every node its
        desired state."""
        await self._calls(self._records.write, KIND, {KEY: settings.model_dump(mode="json")})
        self._settings = settings
        self._on_change()

    def caps_for(self, node_id: str) -> TransferCaps:
        """``node_id``'s caps: its own over its site's over the fleet's."""
        s = self._settings
        caps = s.fleet.caps()
        site = s.sites.get(self._site_of(node_id) or DEFAULT_SITE)
        if site is not None:
            caps = site.caps().merged_over(caps)
        node = s.nodes.get(node_id)
        if node is not None:
            caps = node.caps().merged_over(caps)
        return caps
