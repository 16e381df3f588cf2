"""Which of the configured centrals (``EdgeSettings.central_addresses``) the edge talks to.

Every call to central (Register, the desired-state stream, Unregister, origin chunks)
reads ``current``, so the link and the origin always name the same central. Only the
follower calls ``move``: it owns the registration, and a move is only useful together with
registering again on the new address (an independent central knows nothing of this node
until then). One address: ``move`` does nothing, which is the single-central behaviour."""

from __future__ import annotations

import logging

__all__ = ["CentralRotation"]

log = logging.getLogger(__name__)


class CentralRotation:
    """The central addresses in order and the one in use; round-robin on ``move``."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("at least one central address is needed")
        self._addresses = list(addresses)
        self._index = 0
        self.switches = 0
        """How many times the edge moved to another central."""

    @property
    def current(self) -> str:
        """``host:port`` of the central in use (or being tried)."""
        return self._addresses[self._index]

    @property
    def addresses(self) -> list[str]:
        """Every configured central, in order (a copy)."""
        return list(self._addresses)

    def move(self, why: str) -> bool:
        """Go to the next address (round-robin); False, and nothing changed, with only one."""
        if len(self._addresses) == 1:
            return False
        previous = self.current
        self._index = (self._index + 1) % len(self._addresses)
        self.switches += 1
        log.warning("central %s: %s; moving to central %s", previous, why, self.current)
        return True

    def as_dict(self) -> dict[str, object]:
        """For the edge's status API."""
        return {"address": self.current, "addresses": self.addresses, "switches": self.switches}
