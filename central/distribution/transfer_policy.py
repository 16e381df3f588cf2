"""``TransferPolicy``: the chunk byte-rate caps central sends each edge in its desired state.

Per cap, a node's own entry wins over its site's, which wins over the fleet's; a cap
none of them sets stays unset and the edge keeps its own setting. ``replace`` swaps the
whole policy (``PUT /api/v1/transfer``) and calls ``on_change``, which re-sends every
node its desired state, so a change reaches every connected edge at once.

The policy lives in this process's memory and starts from the ``transfer`` settings:
a restart goes back to them, and on a replicated central each replica keeps its own
(the metadata store has no key-value table to share it through yet)."""

from __future__ import annotations

from collections.abc import Callable

from central.settings import TransferSettings
from fleetwire.transfer import DEFAULT_SITE, TransferCaps


class TransferPolicy:
    """Fleet, per-site and per-node caps; ``caps_for(node_id)`` resolves one node's."""

    def __init__(
        self,
        settings: TransferSettings,
        site_of: Callable[[str], str | None],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``site_of(node_id)``: the site a node registered with (None: not registered)."""
        self._settings = settings
        self._site_of = site_of
        self._on_change = on_change

    @property
    def settings(self) -> TransferSettings:
        """The policy in force."""
        return self._settings

    def replace(self, settings: TransferSettings) -> None:
        """Put ``settings`` in force and re-send every node its desired state."""
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
