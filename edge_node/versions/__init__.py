"""Assembled model files on disk, one directory per version."""

from __future__ import annotations

from edge_node.versions.store import VersionFiles

__all__ = ["VersionFiles"]
