"""How this central holds the fleet's state, picked once at start (``factory.open_fleet_mode``):
alone (``LocalMode``) or as one replica of a replicated central (``replicated.ReplicatedMode``,
PostgreSQL; psycopg imported only then)."""

from __future__ import annotations

from central.fleet_mode.local import LocalMode
from central.fleet_mode.protocol import FleetMode, FleetParts

__all__ = ["FleetMode", "FleetParts", "LocalMode"]
