"""Turns a desired state into files: pins, fetches and assembles every version this
node must hold, owned chunks first, and seeds the chunks it owns in others.

A version may be *staged* (``DesiredVersion.stage``): fetched, verified and assembled like a
served one, then left on disk (``staged``) until a later state serves it, usually with a
``serve_at`` instant: it is then loaded at once and switched to at that instant, turned into
this node's clock by ``to_local`` (central's clock offset, ``edge_node.sync.clock``).

One task per version; a version that fails keeps being retried with backoff (an
edge should converge by itself once peers or central come back). A version whose
chunks alone exceed the cache's cap is refused up front (never pinned nor fetched):
it could only complete by growing the cache past the cap, so it fails with a reason
and the version served now stays. A disk that fills up (a chunk or the assembled file
cannot be written: ``OSError``) fails the version the same way, with the error naming
the directory, logged once; it is retried quietly with backoff and completes once
there is room (what was written is kept). The version served now stays, and right
after a restart the newest complete version of the model on disk is served meanwhile.

Which of a version's artifacts is fetched, pinned and served is ``ArtifactChooser``'s
call (``edge_node.sync.chooser``); a version without a decided artifact has every
artifact fetched, assembled apart and timed, then only the winner assembled and pinned.

A failed version carries a ``reason`` code beside its message (``REASONS``), which the
heartbeat reports so central tells a stuck fetch from a slow one: ``signature`` (its manifest
is not signed by the pinned key), ``cache_too_small``, ``disk`` (a write failed),
``assembly`` (the chunks do not add up to the file) and ``network``: no source delivered a
chunk, through the fetcher's own rounds, for ``fail_after_s``. Until then a version whose
fetches fail stays ``fetching``; after, it is ``failed`` while it keeps being retried, and
completes once a source returns."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, retry_if_exception_type

from edge_node.fetch import ChunkFetcher, FetchFailed
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.sync.chooser import ArtifactChooser, served_as, signed_form
from edge_node.sync.state import DesiredVersion, EdgeDesiredState
from edge_node.sync.trust import ManifestTrust
from edge_node.versions import VersionFiles
from edge_node.versions.store import AssemblyError
from fleetwire.backoff import retrying
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.signing import SignatureError

log = logging.getLogger(__name__)

#: Why a version could not be made ready (``VersionProgress.reason``); ``load`` (ONNX Runtime
#: refused the files) is the inference repository's, added by the heartbeat.
REASONS = ("signature", "cache_too_small", "disk", "assembly", "network", "load")

#: The wait before a version's first retry; it doubles per retry up to ``retry_max_s``, jittered.
_FIRST_RETRY_S = 0.5


@dataclass
class VersionProgress:
    """How far one version is."""

    name: str
    version: str
    state: str  # pending | fetching | staged | complete | failed
    chunks_total: int
    chunks_present: int = 0
    size: int = 0
    error: str | None = None
    #: Why it failed, one of ``REASONS`` (None unless ``state`` is failed).
    reason: str | None = None
    completed_at: float | None = None

    def fail(self, reason: str, error: str) -> None:
        """Mark the version failed for ``reason``, explained by ``error``."""
        self.state, self.reason, self.error = "failed", reason, error

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
        on_complete: Callable[[Manifest, Path, float | None], Awaitable[None]] | None = None,
        on_dropped: Callable[[str], Coroutine[Any, Any, None]] | None = None,
        trust: ManifestTrust | None = None,
        chooser: ArtifactChooser | None = None,
        fail_after_s: float = 60.0,
        to_local: Callable[[float], float] = lambda t: t,
        load_failed: Callable[[tuple[str, str]], bool] = lambda key: False,
        serves: Callable[[str], bool] = lambda name: False,
    ) -> None:
        """``to_local``: an instant of central's clock on this node's (``serve_at``);
        ``load_failed(key)``: whether ONNX Runtime refused that version (a new state retries it)."""
        self._load_failed = load_failed
        #: Whether a version of that model serves now (nothing to stand in before a flip's instant).
        self._serves = serves
        self._to_local = to_local
        #: The versions held (served or staged) in the latest state, by key.
        self._held: dict[tuple[str, str], DesiredVersion] = {}
        #: The ``serve_at`` each served version was last handed to ``on_complete`` with.
        self._handed: dict[tuple[str, str], float | None] = {}
        self._fetcher = fetcher
        #: Decides which artifact of each version is served (default: central's, untimed).
        self.chooser = chooser or ArtifactChooser(node_id=fetcher.node_id)
        #: Where candidates are assembled for timing, apart from the served versions.
        trials = files.root.parent / "trials"
        shutil.rmtree(trials, ignore_errors=True)  # what a timing cut short by a crash left
        self._trials = VersionFiles(trials)
        self._state: EdgeDesiredState | None = None
        self._files = files
        self._on_complete = on_complete
        self._on_dropped = on_dropped
        self._retry_max_s = retry_max_s
        #: How long fetches may fail before the version is reported failed (reason ``network``).
        self._fail_after_s = fail_after_s
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
        wanted = {v.manifest.key: v for v in state.versions if v.held}
        self._held = wanted
        self._state = state
        self.chooser.keep(wanted)
        self._refuse_oversized(wanted)
        self._set_pins(state)
        for key in list(self._tasks):
            if key not in wanted:
                self._tasks.pop(key).cancel()
                self.progress.pop(key, None)
                self._handed.pop(key, None)
        served = {key for key, v in wanted.items() if v.serve}
        for name in {name for name, _ in self._served_models} - {name for name, _ in served}:
            if self._on_dropped is not None:
                self._spawn(self._on_dropped(name))
        self._served_models = served
        for key, version in wanted.items():
            if key in self.refusals:
                continue
            task = self._tasks.get(key)
            now = self.progress[key].state if key in self.progress else None
            if task is None or (task.done() and (now not in ("complete", "staged") or self._redecided(version))):
                self._start(version)
            elif version.serve and task.done() and (now == "staged" or self._load_failed(key)):
                # a staged version's flip, or a load that failed: a new desired state retries it
                task = self._tasks[key] = asyncio.create_task(self._serve_held(key), name=f"serve {key}")
                task.add_done_callback(lambda done, key=key: self._recheck(key, done))  # type: ignore[misc]
            elif version.serve and now == "complete" and self._handed.get(key, version.serve_at) != version.serve_at:
                self._spawn(self._serve_held(key))  # its instant moved: the waiting load re-reads it
        for version in state.versions:
            if not version.serve:
                self._spawn_seed(version)

    def _start(self, version: DesiredVersion) -> None:
        """Materialize ``version``; once done, again if the decision changed meanwhile (central's
        fallback order arrived while it was still being fetched or loaded)."""
        key = version.manifest.key
        task = asyncio.create_task(self._materialize(version), name=f"materialize {key}")
        self._tasks[key] = task

        task.add_done_callback(lambda done: self._recheck(key, done))

    def _recheck(self, key: tuple[str, str], done: asyncio.Task[None]) -> None:
        """After ``done`` (the work on ``key``) ended: start again if it served what the latest
        desired state no longer decides."""
        if done.cancelled() or self._tasks.get(key) is not done or self._state is None:
            return
        latest = next((v for v in self._state.versions if v.serve and v.manifest.key == key), None)
        progress = self.progress.get(key)
        if latest is not None and progress is not None and progress.state == "complete" and self._redecided(latest):
            self._start(latest)

    def _redecided(self, version: DesiredVersion) -> bool:
        """True when ``version`` is served as another artifact than it should be now: central
        ordered a fallback (``force_artifact``) or ended one. Its task runs again, which serves
        an artifact already on disk (FP32 is, beside a shadowed INT8) without fetching."""
        current = self.chooser.choices.get(version.manifest.key)
        if current is None:
            return False
        decided = self.chooser.decided(version)
        if decided is None:  # a fallback ended and nothing is decided: time the artifacts again
            return current.source == "central"
        return decided.artifact != current.artifact

    def _set_pins(self, state: EdgeDesiredState) -> None:
        """Pin the chunks of the artifacts each served version needs (all of them while they are
        timed, the chosen one after) and every chunk this node owns for seeding."""
        node = self._fetcher.node_id
        fits = [v for v in state.versions if v.manifest.key not in self.refusals]
        pins = {c.digest for v in fits if v.held for c in self.chooser.serving_chunks(v)}
        pins |= {d for v in fits for d, owners in v.placement.items() if node in owners}
        try:
            self._fetcher.store.set_pins(pins)
        except OSError as exc:  # a full disk: the work below fails too, with its own error, and retries
            log.warning("cannot record the cache's pins: %s", exc)  # the version's failure is the one ERROR

    def _refuse_oversized(self, wanted: dict[tuple[str, str], DesiredVersion]) -> None:
        """Fail every wanted version whose unique chunks exceed the cache's cap."""
        capacity = self._fetcher.store.stats().capacity
        for key in set(self.refusals) - set(wanted):
            del self.refusals[key]
            self.progress.pop(key, None)
        for key, version in wanted.items():
            m = version.manifest
            checked = key not in self.chooser.unchecked
            self.chooser.unchecked.discard(key)
            needed = sum(c.size for c in self.chooser.serving_chunks(version))
            if needed <= capacity:
                self.refusals.pop(key, None)
                continue
            self.chooser.unchecked.add(key)  # what it serves may fit without its FP32 reference
            if sum(c.size for c in self.chooser.serving_chunks(version)) <= capacity:
                self.refusals.pop(key, None)
                if checked:
                    log.warning(
                        "%s:%s: the cache (%d bytes) cannot hold the FP32 reference beside the artifact served;"
                        " serving it without live checks",
                        m.name, m.version, capacity,
                    )  # fmt: skip
                continue
            self.chooser.unchecked.discard(key)
            if key not in self.refusals:
                reason = (
                    f"cache too small: {m.name}:{m.version} needs {needed} bytes of chunks, the cache cap is"
                    f" {capacity} bytes (MODELFLEET_CACHE_BYTES); keeping the version served now"
                )
                log.error("refusing %s", reason)
                self.refusals[key] = reason
                self._spawn(self._keep_serving(m))
            progress = VersionProgress(
                m.name, m.version, "failed", len(self.chooser.serving_chunks(version)), size=m.size
            )
            progress.fail("cache_too_small", self.refusals[key])
            self.progress[key] = progress

    async def _keep_serving(self, refused: Manifest) -> None:
        """Serve the newest complete version of ``refused``'s model on disk: a no-op while it is
        loaded, what keeps the model served when the refusal comes right after a restart."""
        fallback = await asyncio.to_thread(self._files.latest_complete, refused.name, refused.version)
        if fallback is None or self._refused_on_disk(fallback) is not None:
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

    def _refused_on_disk(self, manifest: Manifest) -> str | None:
        """Why a version found on disk must not be served: ``_refused`` of the manifest central
        signed (the one a ``served_as`` copy was made from, when it is such a copy)."""
        if self._trust is None:
            return None
        try:
            self._trust.verify(manifest)
            return None
        except SignatureError:
            original = signed_form(manifest)  # a served_as copy: its original must verify
        return self._refused(original if original is not None else manifest)

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
        chunks_total = len(self.chooser.serving_chunks(version))
        progress = VersionProgress(m.name, m.version, "pending", chunks_total, size=m.size)
        self.progress[m.key] = progress
        refusal = self._refused(m)
        if refusal is not None:  # a new desired state retries; the version served now stays
            progress.fail("signature", refusal)
            return
        decided = self.chooser.decided(version)
        if decided is not None and await asyncio.to_thread(self._assembled, version, decided.artifact):
            progress.chunks_present, progress.completed_at = progress.chunks_total, time.time()
            await self._hold(m, progress, decided)  # assembled before a restart: serve it again
            return
        disk_error, choice = await self._fetch_and_assemble(version, progress)
        progress.error, progress.reason, progress.completed_at = None, None, time.time()
        if disk_error is not None:
            log.info("%s:%s complete after a write error (%s)", m.name, m.version, disk_error)
        log.info("%s:%s complete (%s, %d bytes)", m.name, m.version, choice.artifact, m.size)
        await self._hold(m, progress, choice)

    async def _hold(self, m: Manifest, progress: VersionProgress, choice: ArtifactChoice) -> None:
        """An assembled version: served as the latest state says (at its instant), or staged."""
        current = self._held.get(m.key)
        if current is not None and not current.serve:
            progress.state = "staged"
            self.chooser.adopt(m, choice)
            log.info("%s:%s staged (%s); served once a flip says so", m.name, m.version, choice.artifact)
            return
        progress.state = "complete"
        await self._completed(m, choice, current.serve_at if current is not None else None)

    async def _serve_held(self, key: tuple[str, str]) -> None:
        """Serve a version assembled before (staged, or waiting for an instant that moved)."""
        version, progress = self._held.get(key), self.progress.get(key)
        choice = self.chooser.decided(version) if version is not None else None
        if version is None or progress is None or choice is None:
            return
        progress.state = "complete"
        await self._completed(version.manifest, choice, version.serve_at)

    def staged(self) -> list[tuple[str, str]]:
        """Versions assembled and held for a flip, not loaded (the heartbeat says ``staged``)."""
        return [key for key, p in self.progress.items() if p.state == "staged"]

    async def _assemble_served(self, version: DesiredVersion) -> ArtifactChoice:
        """Assemble the artifact ``version`` is served as, timing the candidates first when no
        artifact is decided (then the losers' chunks are unpinned)."""
        m = version.manifest
        choice = self.chooser.decided(version)
        if choice is None:
            choice = await self._time_candidates(m)
            self.chooser.adopt(m, choice)
            if self._state is not None:
                self._set_pins(self._state)
        await asyncio.to_thread(self._assemble_reference, version, choice.artifact)
        await asyncio.to_thread(self._files.assemble, served_as(m, choice.artifact), self._fetcher.read)
        return choice

    def _assembled(self, version: DesiredVersion, artifact: str) -> bool:
        """``version`` is on disk as ``artifact``, with its shadow reference if it has one."""
        m = version.manifest
        reference = self.chooser.reference(version, artifact)
        if reference is not None and not self._files.is_complete(served_as(m, reference.artifact)):
            return False
        return self._files.is_complete(served_as(m, artifact))

    def _assemble_reference(self, version: DesiredVersion, artifact: str) -> None:
        """Assemble the artifact ``version`` served as ``artifact`` is checked against on live
        traffic (``edge_node.inference.shadow``), if any and not on disk yet. Before the served
        one: the artifact completed last is the one served after a restart."""
        m = version.manifest
        reference = self.chooser.reference(version, artifact)
        if reference is not None and not self._files.is_complete(served_as(m, reference.artifact)):
            self._files.assemble(served_as(m, reference.artifact), self._fetcher.read)

    async def _time_candidates(self, m: Manifest) -> ArtifactChoice:
        """Assemble every artifact of ``m`` apart from the served versions and time them."""
        trial_dir = self._trials.directory(m.name, m.version)
        try:
            paths = {}
            for artifact in m.artifacts():
                paths[artifact.artifact] = await asyncio.to_thread(self._assemble_trial, m, artifact)
            return await asyncio.to_thread(self.chooser.time, m, paths)
        finally:
            await asyncio.to_thread(shutil.rmtree, trial_dir, True)

    def _assemble_trial(self, m: Manifest, artifact: ArtifactRef) -> Path:
        """One candidate's files, assembled under ``trials/<name>/<version>/<artifact>``."""
        trial = served_as(m, artifact.artifact).model_copy(update={"version": f"{m.version}/{artifact.artifact}"})
        return self._trials.assemble(trial, self._fetcher.read)

    async def _fetch_and_assemble(
        self, version: DesiredVersion, progress: VersionProgress
    ) -> tuple[str | None, ArtifactChoice]:
        """Fetch and assemble ``version``, retrying with backoff until it is done; returns the
        first write error met on the way (logged once, the retries after it quietly), or None,
        and the choice of the artifact it is served as."""
        m = version.manifest
        disk_error: str | None = None
        choice: ArtifactChoice | None = None
        failing_since: float | None = None  # when the first attempt that ended in FetchFailed began
        attempt_began = time.monotonic()

        def failed(state: RetryCallState) -> None:
            nonlocal disk_error, failing_since
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, FetchFailed):
                failing_since = attempt_began if failing_since is None else failing_since
                self._fetch_failed(progress, exc, time.monotonic() - failing_since)
                log.warning("%s:%s failed (%s); retrying in %.1fs", m.name, m.version, exc, state.upcoming_sleep)
                return
            failing_since = None
            if isinstance(exc, OSError):  # a full disk: nothing half-written is kept, what is served stays
                progress.fail("disk", f"{exc.strerror or exc}; keeping the version served now")
                if disk_error is None:
                    log.error("%s:%s failed: %s; retrying until there is room", m.name, m.version, progress.error)
                    self._spawn(self._keep_serving(m))  # after a restart nothing may be loaded yet
                else:
                    log.debug("%s:%s failed again: %s", m.name, m.version, exc)
                disk_error = progress.error
            else:
                progress.fail("assembly", str(exc))
                log.warning("%s:%s failed (%s); retrying in %.1fs", m.name, m.version, exc, state.upcoming_sleep)

        retry = retry_if_exception_type((FetchFailed, AssemblyError, OSError))
        async for attempt in retrying(_FIRST_RETRY_S, self._retry_max_s, retry=retry, before_sleep=failed):
            attempt_began = time.monotonic()
            with attempt:
                await self._fetch_all(version, progress, keep_failed=progress.state == "failed")
                choice = await self._assemble_served(version)
        assert choice is not None  # the loop ends only with a successful attempt
        return disk_error, choice

    def _fetch_failed(self, progress: VersionProgress, exc: FetchFailed, failing_for: float) -> None:
        """A chunk no source delivered: ``failed`` (reason ``network``) once fetches have failed
        for ``fail_after_s``; before that the version stays where it is, the error noted."""
        if failing_for >= self._fail_after_s:
            progress.fail("network", f"{exc} (failing for {failing_for:.0f} s); retrying")
        else:
            progress.error = str(exc)

    def failures(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Every failed version: (name, version) → (reason, message), for the heartbeat."""
        return {
            key: (p.reason or "unknown", p.error or p.reason or "failed")
            for key, p in self.progress.items()
            if p.state == "failed"
        }

    async def _completed(
        self, manifest: Manifest, choice: ArtifactChoice | None = None, serve_at: float | None = None
    ) -> None:
        """Serve ``manifest``'s version as the artifact ``choice`` names (None: as it is on disk),
        from ``serve_at`` (central's clock; None: at once)."""
        self._handed[manifest.key] = serve_at
        if choice is not None:
            self.chooser.adopt(manifest, choice)
            manifest = served_as(manifest, choice.artifact)
        if self._on_complete is not None:
            artifact = choice.artifact if choice is not None else None
            path = self._files.model_path(manifest.name, manifest.version, artifact)
            switch_at = self._to_local(serve_at) if serve_at is not None else None
            if switch_at is not None and switch_at > time.time() and not self._serves(manifest.name):
                # Right after a restart nothing serves the model until the instant: the newest other
                # version on disk does meanwhile (looked up only then: the lookup re-hashes its files).
                self._spawn(self._keep_serving(manifest))
            await self._on_complete(manifest, path, switch_at)

    async def _fetch_all(self, version: DesiredVersion, progress: VersionProgress, keep_failed: bool = False) -> None:
        """Fetch every chunk; ``keep_failed``: a retry after a write error stays ``failed`` until it completes."""
        if not keep_failed:
            progress.state = "fetching"
        chunks = self._chunks_to_fetch(version)
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

    def _chunks_to_fetch(self, version: DesiredVersion) -> list[ChunkRef]:
        """The planned artifacts' chunks (``ArtifactChooser.plan``): others are not fetched."""
        return self.chooser.serving_chunks(version)

    async def stop(self) -> None:
        """Cancel all work."""
        tasks = list(self._tasks.values()) + list(self._seed_tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
