"""Following central's desired state: register, watch, then admit, fetch, assemble and
hand each version to the inference repository (``Materializer``), choosing which artifact
of it this node serves (``ArtifactChooser``)."""

from __future__ import annotations

from edge_node.sync.chooser import ArtifactChooser
from edge_node.sync.follower import DesiredStateFollower
from edge_node.sync.handoff import ServingTarget
from edge_node.sync.materializer import Materializer
from edge_node.sync.progress import REASONS, VersionProgress
from edge_node.sync.trust import ManifestTrust

__all__ = [
    "REASONS",
    "ArtifactChooser",
    "DesiredStateFollower",
    "ManifestTrust",
    "Materializer",
    "ServingTarget",
    "VersionProgress",
]
