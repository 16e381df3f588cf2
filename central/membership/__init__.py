"""Which edges are in the fleet, and where they listen."""

from __future__ import annotations

from central.membership.nodes import NodeDirectory, NodeRecord

__all__ = ["NodeDirectory", "NodeRecord"]
