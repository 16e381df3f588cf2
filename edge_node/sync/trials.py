"""Artifact trials: when no artifact of a version is decided, every one is assembled apart
from the served versions (under ``<data_dir>/trials/<name>/<version>/<artifact>``) and timed
on this node (``ArtifactChooser.time``, with the ``ArtifactTimer``); the trial files are
removed afterwards, and whatever a timing cut short by a crash left at start-up."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.sync.chooser import ArtifactChooser, served_as
from edge_node.versions import VersionFiles
from fleetwire.manifest import ArtifactRef, Manifest

__all__ = ["ArtifactTrials"]


class ArtifactTrials:
    """Times the artifacts of a version, assembled from chunks ``read`` returns, under ``root``."""

    def __init__(self, root: Path, read: Callable[[str], bytes | None], chooser: ArtifactChooser) -> None:
        shutil.rmtree(root, ignore_errors=True)  # what a timing cut short by a crash left
        self._files = VersionFiles(root)
        self._read = read
        self._chooser = chooser

    async def time(self, m: Manifest) -> ArtifactChoice:
        """Assemble every artifact of ``m`` apart from the served versions and time them."""
        trial_dir = self._files.directory(m.name, m.version)
        try:
            paths = {}
            for artifact in m.artifacts():
                paths[artifact.artifact] = await asyncio.to_thread(self._assemble, m, artifact)
            return await asyncio.to_thread(self._chooser.time, m, paths)
        finally:
            await asyncio.to_thread(shutil.rmtree, trial_dir, True)

    def _assemble(self, m: Manifest, artifact: ArtifactRef) -> Path:
        """One candidate's files, assembled under ``trials/<name>/<version>/<artifact>``."""
        trial = served_as(m, artifact.artifact).model_copy(update={"version": f"{m.version}/{artifact.artifact}"})
        return self._files.assemble(trial, self._read)
