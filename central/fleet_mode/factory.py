"""Picks the fleet mode once, at start. Its own module, not the package's ``__init__``: the
replicated mode's parts (``central.ha``) import the package's protocol, and a lazy import of
the replicated mode from the package itself would close an import cycle."""

from __future__ import annotations

from central.fleet_mode.local import LocalMode
from central.fleet_mode.protocol import FleetMode
from central.settings import CentralSettings

__all__ = ["open_fleet_mode"]


def open_fleet_mode(settings: CentralSettings) -> FleetMode:
    """``ReplicatedMode`` when ``ha.replica_id`` names this process a replica, else ``LocalMode``."""
    if settings.ha.replica_id is None:
        return LocalMode()
    from central.fleet_mode.replicated import ReplicatedMode  # psycopg: the [postgres] extra

    return ReplicatedMode(settings)
