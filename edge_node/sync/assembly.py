"""Fetch-and-assemble of one version: its planned artifacts' chunks (owned ones first), then
the files of the artifact it is served as (and of its FP32 reference, when it is INT8
checked on live traffic), retried with backoff until done.

A version whose fetches fail stays ``fetching`` until no source delivered a chunk, through
the fetcher's own rounds, for ``fail_after_s``; after, it is ``failed`` (reason ``network``)
while it keeps being retried, and completes once a source returns. A disk that fills up (a
chunk or the assembled file cannot be written: ``OSError``) fails it with reason ``disk``,
the error naming the directory, logged once; it is retried quietly and completes once there
is room (what was written is kept). Chunks that do not add up to the file: ``assembly``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tenacity import RetryCallState, retry_if_exception_type

from edge_node.fetch import ChunkFetcher, FetchFailed
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.sync.chooser import ArtifactChooser, served_as
from edge_node.sync.progress import VersionProgress
from edge_node.sync.state import DesiredVersion
from edge_node.sync.trials import ArtifactTrials
from edge_node.versions import VersionFiles
from edge_node.versions.store import AssemblyError
from fleetwire.backoff import retrying
from fleetwire.manifest import Manifest

__all__ = ["VersionAssembly"]

log = logging.getLogger(__name__)

#: The wait before a version's first retry; it doubles per retry up to ``retry_max_s``, jittered.
FIRST_RETRY_S = 0.5


class VersionAssembly:
    """Fetches and assembles versions into ``files``. ``on_chosen()`` runs once timing chose
    an artifact (the losers' chunks are then unpinned); ``on_disk_full(manifest)`` the first
    time a write fails (something must keep serving the model meanwhile)."""

    def __init__(
        self,
        fetcher: ChunkFetcher,
        files: VersionFiles,
        chooser: ArtifactChooser,
        trials: ArtifactTrials,
        *,
        retry_max_s: float,
        fail_after_s: float,
        on_chosen: Callable[[], None],
        on_disk_full: Callable[[Manifest], None],
    ) -> None:
        self._fetcher = fetcher
        self._files = files
        self._chooser = chooser
        self._trials = trials
        self._retry_max_s = retry_max_s
        #: How long fetches may fail before the version is reported failed (reason ``network``).
        self._fail_after_s = fail_after_s
        self._on_chosen = on_chosen
        self._on_disk_full = on_disk_full

    def assembled(self, version: DesiredVersion, artifact: str) -> bool:
        """``version`` is on disk as ``artifact``, with its shadow reference if it has one."""
        m = version.manifest
        reference = self._chooser.companion(version, artifact)
        if reference is not None and not self._files.is_complete(served_as(m, reference.artifact)):
            return False
        return self._files.is_complete(served_as(m, artifact))

    async def run(self, version: DesiredVersion, progress: VersionProgress) -> tuple[str | None, ArtifactChoice]:
        """Fetch and assemble ``version``, retrying with backoff until it is done; returns the
        first write error met on the way (logged once, the retries after it quietly), or None,
        and the choice of the artifact it is served as."""
        choice: ArtifactChoice | None = None
        retries = _Retries(version.manifest, progress, self._fail_after_s, self._on_disk_full)
        retry = retry_if_exception_type((FetchFailed, AssemblyError, OSError))
        async for attempt in retrying(FIRST_RETRY_S, self._retry_max_s, retry=retry, before_sleep=retries.failed):
            retries.attempt_began = time.monotonic()
            with attempt:
                await self._fetch_all(version, progress, keep_failed=progress.state == "failed")
                choice = await self._assemble_served(version)
        assert choice is not None  # the loop ends only with a successful attempt
        return retries.disk_error, choice

    async def _assemble_served(self, version: DesiredVersion) -> ArtifactChoice:
        """Assemble the artifact ``version`` is served as, timing the candidates first when no
        artifact is decided (then the losers' chunks are unpinned)."""
        m = version.manifest
        choice = self._chooser.decided(version)
        if choice is None:
            choice = await self._trials.time(m)
            self._chooser.adopt(m, choice)
            self._on_chosen()
        await asyncio.to_thread(self._assemble_reference, version, choice.artifact)
        await asyncio.to_thread(self._files.assemble, served_as(m, choice.artifact), self._fetcher.read)
        return choice

    def _assemble_reference(self, version: DesiredVersion, artifact: str) -> None:
        """Assemble the artifact ``version`` served as ``artifact`` is checked against on live
        traffic (``edge_node.inference.shadow``), if any and not on disk yet. Before the served
        one: the artifact completed last is the one served after a restart."""
        m = version.manifest
        reference = self._chooser.companion(version, artifact)
        if reference is not None and not self._files.is_complete(served_as(m, reference.artifact)):
            self._files.assemble(served_as(m, reference.artifact), self._fetcher.read)

    async def _fetch_all(self, version: DesiredVersion, progress: VersionProgress, keep_failed: bool = False) -> None:
        """Fetch every planned chunk (``ArtifactChooser.plan``: others are not fetched), owned
        ones first; ``keep_failed``: a retry after a write error stays ``failed`` until it completes."""
        if not keep_failed:
            progress.state = "fetching"
        chunks = self._chooser.serving_chunks(version)
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


class _Retries:
    """What the retries of one version have met: how long fetches have failed, the first
    write error; ``failed`` notes each failed attempt on its progress before the wait."""

    def __init__(
        self,
        manifest: Manifest,
        progress: VersionProgress,
        fail_after_s: float,
        on_disk_full: Callable[[Manifest], None],
    ) -> None:
        self._m = manifest
        self._progress = progress
        self._fail_after_s = fail_after_s
        self._on_disk_full = on_disk_full
        self.disk_error: str | None = None
        self.failing_since: float | None = None  # when the first attempt that ended in FetchFailed began
        self.attempt_began = time.monotonic()

    def failed(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        m, progress = self._m, self._progress
        if isinstance(exc, FetchFailed):
            self.failing_since = self.attempt_began if self.failing_since is None else self.failing_since
            self._fetch_failed(exc, time.monotonic() - self.failing_since)
            log.warning("%s:%s failed (%s); retrying in %.1fs", m.name, m.version, exc, state.upcoming_sleep)
            return
        self.failing_since = None
        if isinstance(exc, OSError):  # a full disk: nothing half-written is kept, what is served stays
            self._disk_failed(exc)
        else:
            progress.fail("assembly", str(exc))
            log.warning("%s:%s failed (%s); retrying in %.1fs", m.name, m.version, exc, state.upcoming_sleep)

    def _disk_failed(self, exc: OSError) -> None:
        m, progress = self._m, self._progress
        progress.fail("disk", f"{exc.strerror or exc}; keeping the version served now")
        if self.disk_error is None:
            log.error("%s:%s failed: %s; retrying until there is room", m.name, m.version, progress.error)
            self._on_disk_full(m)  # after a restart nothing may be loaded yet
        else:
            log.debug("%s:%s failed again: %s", m.name, m.version, exc)
        self.disk_error = progress.error

    def _fetch_failed(self, exc: FetchFailed, failing_for: float) -> None:
        """A chunk no source delivered: ``failed`` (reason ``network``) once fetches have failed
        for ``fail_after_s``; before that the version stays where it is, the error noted."""
        if failing_for >= self._fail_after_s:
            self._progress.fail("network", f"{exc} (failing for {failing_for:.0f} s); retrying")
        else:
            self._progress.error = str(exc)
