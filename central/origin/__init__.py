"""Central as the origin of chunk bytes: owner-first policy and egress cap."""

from __future__ import annotations

from central.origin.egress import TokenBucket
from central.origin.service import OriginService, OriginStats

__all__ = ["OriginService", "OriginStats", "TokenBucket"]
