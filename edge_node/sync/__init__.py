"""Following central's desired state: register, watch, fetch, assemble."""

from __future__ import annotations

from edge_node.sync.follower import DesiredStateFollower
from edge_node.sync.materializer import Materializer, VersionProgress
from edge_node.sync.trust import ManifestTrust

__all__ = ["DesiredStateFollower", "ManifestTrust", "Materializer", "VersionProgress"]
