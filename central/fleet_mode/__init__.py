"""How this central holds the fleet's state, picked once at start: alone (``LocalMode``) or as
one replica of a replicated central (``ReplicatedMode``, PostgreSQL; psycopg imported only then)."""

from __future__ import annotations

from central.fleet_mode.local import LocalMode
from central.fleet_mode.protocol import FleetMode, FleetParts
from central.settings import CentralSettings

__all__ = ["FleetMode", "FleetParts", "LocalMode", "open_fleet_mode"]


def open_fleet_mode(settings: CentralSettings) -> FleetMode:
    """``ReplicatedMode`` when ``ha.replica_id`` names this process a replica, else ``LocalMode``."""
    if settings.ha.replica_id is None:
        return LocalMode()
    from central.fleet_mode.replicated import ReplicatedMode  # psycopg: the [postgres] extra

    return ReplicatedMode(settings)
