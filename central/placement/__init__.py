"""Chunk placement: which edges own which chunk, and who may pull from origin.

Consistent hashing with bounded loads spreads each model version's chunks over
the fleet with ``r`` owners per chunk; the service keeps that placement current
as edges join and leave and enforces the origin protection rule.
"""

from __future__ import annotations

from central.placement.ring import (
    Placement,
    RingMember,
    load_by_node,
    max_over_mean,
    moved_fraction,
    place,
)
from central.placement.service import PlacementService, VersionKey
from central.placement.sites import home_site_counts, place_by_site, site_order

__all__ = [
    "Placement",
    "PlacementService",
    "RingMember",
    "VersionKey",
    "home_site_counts",
    "load_by_node",
    "max_over_mean",
    "moved_fraction",
    "place",
    "place_by_site",
    "site_order",
]
