"""Central as the origin of chunk bytes: owner-first policy and egress cap."""

from __future__ import annotations

from central.origin.egress import EgressBucket
from central.origin.service import OriginService, OriginStats

__all__ = ["EgressBucket", "OriginService", "OriginStats"]
