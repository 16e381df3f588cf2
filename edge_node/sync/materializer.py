"""Turns a desired state into files: pins, fetches and assembles every version this
node must hold, owned chunks first, and seeds the chunks it owns in others.

One task per version; a version that fails keeps being retried with backoff (an
edge should converge by itself once peers or central come back). A version whose
chunks alone exceed the cache's cap is refused up front (never pinned nor fetched):
it could only complete by growing the cache past the cap, so it fails with a reason
and the version served now stays. A disk that fills up (a chunk or the assembled file
cannot be written: ``OSError``) fails the version the same way, with the error naming
the directory, logged once; it is retried quietly with backoff and completes once
there is room (what was written is kept). The version served now stays, and right
after a restart the newest complete version of the model on disk is served meanwhile."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, retry_if_exception_type

from edge_node.fetch import ChunkFetcher, FetchFailed
from edge_node.sync.state import DesiredVersion, EdgeDesiredState, artifact_to_serve, chunk_bytes, served_digests
from edge_node.sync.trust import ManifestTrust
from edge_node.versions import VersionFiles
from edge_node.versions.store import AssemblyError
from fleetwire.backoff import retrying
from fleetwire.manifest import Manifest
from fleetwire.signing import SignatureError

log = logging.getLogger(__name__)

#: The wait before a version's first retry; it doubles per retry up to ``retry_max_s``, jittered.
_FIRST_RETRY_S = 0.5


@dataclass
class VersionProgress:
    """How far one version is."""

    name: str
    version: str
    state: str  # pending | fetching | complete | failed
    chunks_total: int
    chunks_present: int = 0
    size: int = 0
    error: str | None = None
    completed_at: float | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return dict(vars(self))


class Materializer:
    """Keeps the local disk in line with the latest desired state."""

    def __init__(
        self,
        fetcher: ChunkFetcher,
        files: VersionFiles,
        retry_max_s: float = 5.0,
        on_complete: Callable[[Manifest, Path], Awaitable[None]] | None = None,
        on_dropped: Callable[[str], Coroutine[Any, Any, None]] | None = None,
        trust: ManifestTrust | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._files = files
        self._on_complete = on_complete
        self._on_dropped = on_dropped
        self._retry_max_s = retry_max_s
        #: Checks central's signature on every manifest before any of its chunks is fetched.
        self._trust = trust
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._seed_tasks: set[asyncio.Task[None]] = set()
        self.progress: dict[tuple[str, str], VersionProgress] = {}
        self._served_models: set[tuple[str, str]] = set()
        #: Versions refused because they cannot fit in the cache: (name, version) → reason.
        self.refusals: dict[tuple[str, str], str] = {}

    def apply(self, state: EdgeDesiredState) -> None:
        """Start work for new versions, drop work for versions no longer wanted."""
        node = self._fetcher.node_id
        wanted = {v.manifest.key: v for v in state.versions if v.serve}
        self._refuse_oversized(wanted)
        fits = [v for v in state.versions if v.manifest.key not in self.refusals]
        pins = served_digests(fits)
        pins |= {d for v in fits for d, owners in v.placement.items() if node in owners}
        try:
            self._fetcher.store.set_pins(pins)
        except OSError as exc:  # a full disk: the work below fails too, with its own error, and retries
            log.error("cannot record the cache's pins: %s", exc)
        for key in list(self._tasks):
            if key not in wanted:
                self._tasks.pop(key).cancel()
                self.progress.pop(key, None)
        wanted_models = {name for name, _ in wanted}
        for name in {name for name, _ in self._served_models} - wanted_models:
            if self._on_dropped is not None:
                self._spawn(self._on_dropped(name))
        self._served_models = set(wanted)
        for key, version in wanted.items():
            if key in self.refusals:
                continue
            task = self._tasks.get(key)
            if task is None or (task.done() and self.progress[key].state != "complete"):
                self._tasks[key] = asyncio.create_task(self._materialize(version), name=f"materialize {key}")
        for version in state.versions:
            if not version.serve:
                self._spawn_seed(version)

    def _refuse_oversized(self, wanted: dict[tuple[str, str], DesiredVersion]) -> None:
        """Fail every wanted version whose unique chunks exceed the cache's cap."""
        capacity = self._fetcher.store.stats().capacity
        for key in set(self.refusals) - set(wanted):
            del self.refusals[key]
            self.progress.pop(key, None)
        for key, version in wanted.items():
            m = version.manifest
            artifact = artifact_to_serve(m)
            needed = chunk_bytes(artifact)
            if needed <= capacity:
                self.refusals.pop(key, None)
                continue
            if key not in self.refusals:
                reason = (
                    f"cache too small: {m.name}:{m.version} needs {needed} bytes of chunks, the cache cap is"
                    f" {capacity} bytes (MODELFLEET_CACHE_BYTES); keeping the version served now"
                )
                log.error("refusing %s", reason)
                self.refusals[key] = reason
                self._spawn(self._keep_serving(m))
            progress = VersionProgress(
                m.name, m.version, "failed", len(artifact.all_chunks()), size=artifact.total_size
            )
            progress.error = self.refusals[key]
            self.progress[key] = progress

    async def _keep_serving(self, refused: Manifest) -> None:
        """Serve the newest complete version of ``refused``'s model on disk: a no-op while it is
        loaded, what keeps the model served when the refusal comes right after a restart."""
        fallback = await asyncio.to_thread(self._files.latest_complete, refused.name, refused.version)
        if fallback is None or self._refused(fallback) is not None:
            return
        log.info("%s: still serving version %s from disk", refused.name, fallback.version)
        await self._completed(fallback)

    def _spawn_seed(self, version: DesiredVersion) -> None:
        self._spawn(self._seed(version))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._seed_tasks.add(task)
        task.add_done_callback(self._seed_tasks.discard)

    def _refused(self, manifest: Manifest) -> str | None:
        """Why ``manifest`` must not be fetched (a bad or missing signature), or None."""
        if self._trust is None:
            return None
        try:
            self._trust.verify(manifest)
        except SignatureError as exc:
            log.error("refusing %s:%s: %s", manifest.name, manifest.version, exc)
            return f"manifest refused: {exc}"
        return None

    async def _seed(self, version: DesiredVersion) -> None:
        if self._refused(version.manifest) is not None:
            return
        sizes = {c.digest: c.size for c in version.manifest.unique_chunks()}
        node = self._fetcher.node_id
        owned = [d for d, owners in version.placement.items() if node in owners]
        await asyncio.gather(
            *(self._fetcher.ensure(d, sizes[d], version.placement[d]) for d in owned), return_exceptions=True
        )

    async def _materialize(self, version: DesiredVersion) -> None:
        m = version.manifest
        artifact = artifact_to_serve(m)
        progress = VersionProgress(m.name, m.version, "pending", len(artifact.all_chunks()), size=artifact.total_size)
        self.progress[m.key] = progress
        refusal = self._refused(m)
        if refusal is not None:  # a new desired state retries; the version served now stays
            progress.state, progress.error = "failed", refusal
            return
        if await asyncio.to_thread(self._files.is_complete, m, artifact.artifact):
            progress.state, progress.chunks_present, progress.completed_at = (
                "complete",
                progress.chunks_total,
                time.time(),
            )
            await self._completed(m, artifact.artifact)  # assembled before a restart: serve it again
            return
        disk_error = await self._fetch_and_assemble(version, progress)
        progress.state, progress.error, progress.completed_at = "complete", None, time.time()
        if disk_error is not None:
            log.info("%s:%s complete after a write error (%s)", m.name, m.version, disk_error)
        log.info("%s:%s complete (%s, %d bytes)", m.name, m.version, artifact.artifact, artifact.total_size)
        await self._completed(m, artifact.artifact)

    async def _fetch_and_assemble(self, version: DesiredVersion, progress: VersionProgress) -> str | None:
        """Fetch and assemble ``version``, retrying with backoff until it is done; returns the
        first write error met on the way (logged once, the retries after it quietly), or None."""
        m = version.manifest
        disk_error: str | None = None

        def failed(state: RetryCallState) -> None:
            nonlocal disk_error
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, OSError):  # a full disk: nothing half-written is kept, what is served stays
                progress.state, progress.error = "failed", f"{exc.strerror or exc}; keeping the version served now"
                if disk_error is None:
                    log.error("%s:%s failed: %s; retrying until there is room", m.name, m.version, progress.error)
                    self._spawn(self._keep_serving(m))  # after a restart nothing may be loaded yet
                else:
                    log.debug("%s:%s failed again: %s", m.name, m.version, exc)
                disk_error = progress.error
            else:
                progress.state, progress.error = "failed", str(exc)
                log.warning("%s:%s failed (%s); retrying in %.1fs", m.name, m.version, exc, state.upcoming_sleep)

        retry = retry_if_exception_type((FetchFailed, AssemblyError, OSError))
        async for attempt in retrying(_FIRST_RETRY_S, self._retry_max_s, retry=retry, before_sleep=failed):
            with attempt:
                await self._fetch_all(version, progress, keep_failed=disk_error is not None)
                await asyncio.to_thread(self._files.assemble, m, self._fetcher.read, artifact_to_serve(m).artifact)
        return disk_error

    async def _completed(self, manifest: Manifest, artifact: str | None = None) -> None:
        """Hand the assembled ``model.onnx`` (its data files beside it) to the server;
        ``artifact`` None: the one completed on disk most recently."""
        if self._on_complete is not None:
            await self._on_complete(manifest, self._files.model_path(manifest.name, manifest.version, artifact))

    async def _fetch_all(self, version: DesiredVersion, progress: VersionProgress, keep_failed: bool = False) -> None:
        """Fetch every chunk; ``keep_failed``: a retry after a write error stays ``failed`` until it completes."""
        if not keep_failed:
            progress.state = "fetching"
        chunks = artifact_to_serve(version.manifest).all_chunks()
        node = self._fetcher.node_id
        # Owned chunks first: others are waiting on this node for them.
        chunks.sort(key=lambda c: node not in version.placement.get(c.digest, []))
        progress.chunks_present = 0

        async def one(digest: str, size: int) -> None:
            await self._fetcher.ensure(digest, size, version.placement.get(digest, []))

        tasks = [asyncio.create_task(one(c.digest, c.size)) for c in chunks]
        try:
            for done in asyncio.as_completed(tasks):
                await done
                progress.chunks_present += 1
        finally:
            for t in tasks:
                t.cancel()
        progress.chunks_present = progress.chunks_total

    async def stop(self) -> None:
        """Cancel all work."""
        tasks = list(self._tasks.values()) + list(self._seed_tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
