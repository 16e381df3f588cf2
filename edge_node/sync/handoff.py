"""Handing assembled versions to the inference repository (a :class:`ServingTarget`): as the
artifact their choice names, from their ``serve_at`` instant (central's clock, turned into
this node's by ``to_local``), and the stand-ins served meanwhile.

When a version cannot be made ready (refused for the cache's cap, a full disk) or its flip's
instant is still ahead right after a restart, nothing may serve the model yet: the newest
complete version of it on disk is served meanwhile (looked up only then, since the lookup
checks its files: re-hashes those its verified record does not vouch for), as long as
central's signature on it still verifies."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.sync.admission import Admission
from edge_node.sync.chooser import ArtifactChooser, served_as
from edge_node.versions import VersionFiles
from fleetwire.manifest import Manifest

__all__ = ["ServingHandoff", "ServingTarget"]

log = logging.getLogger(__name__)

Key = tuple[str, str]


class ServingTarget(Protocol):
    """Where assembled versions go: the inference repository (``ModelRepository``)."""

    async def load(self, manifest: Manifest, path: Path, switch_at: float | None = None) -> None:
        """Serve ``manifest``'s files at ``path`` (from ``switch_at``, this node's clock)."""

    async def unload(self, name: str) -> None:
        """Stop serving model ``name``."""

    def failed(self, key: Key) -> bool:
        """Whether ONNX Runtime refused that version (a new desired state retries it)."""

    def serves(self, name: str) -> bool:
        """Whether a version of model ``name`` serves now."""


def offer_of(manifest: Manifest) -> tuple[str, ...]:
    """The default artifact, the alternatives and the pending candidates of ``manifest``, by name."""
    return (
        manifest.artifact,
        *(a.artifact for a in manifest.alternatives),
        "|",
        *(p.artifact for p in manifest.pending),
    )


class ServingHandoff:
    """Hands versions to ``serving``; ``spawn`` runs a background coroutine (the
    materializer's, so its stop cancels them)."""

    def __init__(
        self,
        serving: ServingTarget,
        files: VersionFiles,
        chooser: ArtifactChooser,
        admission: Admission,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        to_local: Callable[[float], float],
    ) -> None:
        self.serving = serving
        self._files = files
        self._chooser = chooser
        self._admission = admission
        self._spawn = spawn
        self._to_local = to_local
        #: The ``serve_at`` each served version was last handed over with.
        self.handed: dict[Key, float | None] = {}
        #: What each served version could be served as when last handed over (central re-issues
        #: a manifest when it promotes or rejects a pending INT8 candidate; a key rotation's
        #: re-signing changes nothing here).
        self.offers: dict[Key, tuple[str, ...]] = {}

    async def serve(
        self, manifest: Manifest, choice: ArtifactChoice | None = None, serve_at: float | None = None
    ) -> None:
        """Serve ``manifest``'s version as the artifact ``choice`` names (None: as it is on disk),
        from ``serve_at`` (central's clock; None: at once)."""
        self.handed[manifest.key] = serve_at
        self.offers[manifest.key] = offer_of(manifest)
        if choice is not None:
            self._chooser.adopt(manifest, choice)
            manifest = served_as(manifest, choice.artifact)
        artifact = choice.artifact if choice is not None else None
        path = self._files.model_path(manifest.name, manifest.version, artifact)
        switch_at = self._to_local(serve_at) if serve_at is not None else None
        if switch_at is not None and switch_at > time.time() and not self.serving.serves(manifest.name):
            # Right after a restart nothing serves the model until the instant: the newest other
            # version on disk does meanwhile (looked up only then: the lookup checks its files).
            self.keep_serving_later(manifest)
        await self.serving.load(manifest, path, switch_at)

    def keep_serving_later(self, refused: Manifest) -> None:
        """In the background, :meth:`keep_serving` ``refused``'s model."""
        self._spawn(self.keep_serving(refused))

    async def keep_serving(self, refused: Manifest) -> None:
        """Serve the newest complete version of ``refused``'s model on disk: a no-op while it is
        loaded, what keeps the model served when the refusal comes right after a restart."""
        fallback = await asyncio.to_thread(self._files.latest_complete, refused.name, refused.version)
        if fallback is None or self._admission.refused_on_disk(fallback) is not None:
            return
        log.info("%s: still serving version %s from disk", refused.name, fallback.version)
        await self.serve(fallback)
