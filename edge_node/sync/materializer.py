"""Turns a desired state into files: pins, fetches and assembles every version this
node must hold, owned chunks first, and seeds the chunks it owns in others.

A version may be *staged* (``DesiredVersion.stage``): fetched, verified and assembled like a
served one, then left on disk (``staged``) until a later state serves it, usually with a
``serve_at`` instant: it is then loaded at once and switched to at that instant, turned into
this node's clock by ``to_local`` (central's clock offset, ``edge_node.sync.clock``).

One task per version; a version that fails keeps being retried with backoff (an edge should
converge by itself once peers or central come back). :class:`Materializer` is the thin
composition of four parts, one job each: ``Admission`` (``admission.py``: central's
signature and the cache's cap, checked before any chunk is fetched), ``VersionAssembly``
(``assembly.py``: fetch and assemble, retried; the failure reasons), ``ArtifactTrials``
(``trials.py``: every artifact assembled apart and timed when none is decided) and
``ServingHandoff`` (``handoff.py``: assembled versions to a :class:`ServingTarget`, the
inference repository, at their instant, and the stand-ins served from disk meanwhile). Which
of a version's artifacts is fetched, pinned and served is ``ArtifactChooser``'s call
(``edge_node.sync.chooser``). When a version cannot be made ready (refused, a full disk) the
version served now stays.

A failed version carries a ``reason`` code beside its message (``REASONS``), which the
heartbeat reports so central tells a stuck fetch from a slow one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from edge_node.fetch import ChunkFetcher
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.sync.admission import Admission
from edge_node.sync.assembly import VersionAssembly
from edge_node.sync.chooser import ArtifactChooser
from edge_node.sync.handoff import ServingHandoff, ServingTarget, offer_of
from edge_node.sync.progress import REASONS, VersionProgress
from edge_node.sync.state import DesiredVersion, EdgeDesiredState
from edge_node.sync.trials import ArtifactTrials
from edge_node.sync.trust import ManifestTrust
from edge_node.versions import VersionFiles
from fleetwire.manifest import Manifest

__all__ = ["REASONS", "Materializer", "ServingTarget", "VersionProgress"]

log = logging.getLogger(__name__)

Key = tuple[str, str]


class Materializer:
    """Keeps the local disk in line with the latest desired state and hands what is
    assembled to ``serving``."""

    def __init__(
        self,
        fetcher: ChunkFetcher,
        files: VersionFiles,
        serving: ServingTarget,
        *,
        trust: ManifestTrust | None = None,
        chooser: ArtifactChooser | None = None,
        retry_max_s: float = 5.0,
        fail_after_s: float = 60.0,
        to_local: Callable[[float], float] = lambda t: t,
    ) -> None:
        """``trust`` checks central's signature on every manifest (None: unchecked);
        ``fail_after_s``: how long fetches may fail before a version is reported failed;
        ``to_local``: an instant of central's clock on this node's (``serve_at``)."""
        self._fetcher = fetcher
        #: Decides which artifact of each version is served (default: central's, untimed).
        self.chooser = chooser or ArtifactChooser(node_id=fetcher.node_id)
        self.admission = Admission(self.chooser, lambda: fetcher.store.stats().capacity, trust)
        """The signature and cache-size gates (``refusals``)."""
        self._handoff = ServingHandoff(serving, files, self.chooser, self.admission, self._spawn, to_local)
        trials = ArtifactTrials(files.root.parent / "trials", fetcher.read, self.chooser)
        self._assembly = VersionAssembly(
            fetcher,
            files,
            self.chooser,
            trials,
            retry_max_s=retry_max_s,
            fail_after_s=fail_after_s,
            on_chosen=self._repin,
            on_disk_full=lambda m: self._handoff.keep_serving_later(m),
        )
        #: The versions held (served or staged) in the latest state, by key.
        self._held: dict[Key, DesiredVersion] = {}
        self._state: EdgeDesiredState | None = None
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._seed_tasks: set[asyncio.Task[None]] = set()
        self.progress: dict[Key, VersionProgress] = {}
        self._served_models: set[Key] = set()

    @property
    def refusals(self) -> dict[Key, str]:
        """Versions refused because they cannot fit in the cache: (name, version) → reason."""
        return self.admission.refusals

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
                self._handoff.handed.pop(key, None)
                self._handoff.offers.pop(key, None)
        served = {key for key, v in wanted.items() if v.serve}
        for name in {name for name, _ in self._served_models} - {name for name, _ in served}:
            self._spawn(self._handoff.serving.unload(name))
        self._served_models = served
        for key, version in wanted.items():
            if key not in self.refusals:
                self._follow(key, version)
        for version in state.versions:
            if not version.serve:
                self._spawn(self._seed(version))

    def _follow(self, key: Key, version: DesiredVersion) -> None:
        """Start, restart or re-serve the work on one held version as the new state says."""
        task = self._tasks.get(key)
        now = self.progress[key].state if key in self.progress else None
        if task is None or (task.done() and (now not in ("complete", "staged") or self._redecided(version))):
            self._start(version)
        elif version.serve and task.done() and (now == "staged" or self._handoff.serving.failed(key)):
            # a staged version's flip, or a load that failed: a new desired state retries it
            task = self._tasks[key] = asyncio.create_task(self._serve_held(key), name=f"serve {key}")
            task.add_done_callback(lambda done: self._recheck(key, done))
        elif (
            version.serve and now == "complete" and self._handoff.handed.get(key, version.serve_at) != version.serve_at
        ):
            self._spawn(self._serve_held(key))  # its instant moved: the waiting load re-reads it

    def _start(self, version: DesiredVersion) -> None:
        """Materialize ``version``; once done, again if the decision changed meanwhile (central's
        fallback order arrived while it was still being fetched or loaded)."""
        key = version.manifest.key
        task = asyncio.create_task(self._materialize(version), name=f"materialize {key}")
        self._tasks[key] = task

        task.add_done_callback(lambda done: self._recheck(key, done))

    def _recheck(self, key: Key, done: asyncio.Task[None]) -> None:
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
        ordered a fallback (``force_artifact``) or ended one, or re-issued the manifest (a pending
        INT8 promoted or rejected). Its task runs again, which serves an artifact already on disk
        (FP32 is, beside a shadowed INT8) without fetching."""
        current = self.chooser.choices.get(version.manifest.key)
        if current is None:
            return False
        handed = self._handoff.offers.get(version.manifest.key)
        if handed is not None and handed != offer_of(version.manifest):
            return True
        decided = self.chooser.decided(version)
        if decided is None:  # a fallback ended, or more artifacts came: time the artifacts again
            return current.source in ("central", "only")
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

    def _repin(self) -> None:
        """Timing chose an artifact: the losers' chunks are unpinned."""
        if self._state is not None:
            self._set_pins(self._state)

    def _refuse_oversized(self, wanted: dict[Key, DesiredVersion]) -> None:
        """Fail every wanted version whose unique chunks exceed the cache's cap (``Admission``),
        keeping the version served now."""
        verdict = self.admission.check_sizes(wanted)
        for key in verdict.dropped:
            self.progress.pop(key, None)
        for version, first in verdict.refused:
            m = version.manifest
            if first:
                self._handoff.keep_serving_later(m)
            progress = VersionProgress(
                m.name, m.version, "failed", len(self.chooser.serving_chunks(version)), size=m.size
            )
            progress.fail("cache_too_small", self.refusals[m.key])
            self.progress[m.key] = progress

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._seed_tasks.add(task)
        task.add_done_callback(self._seed_tasks.discard)

    async def _seed(self, version: DesiredVersion) -> None:
        if self.admission.signature_refusal(version.manifest) is not None:
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
        refusal = self.admission.signature_refusal(m)
        if refusal is not None:  # a new desired state retries; the version served now stays
            progress.fail("signature", refusal)
            return
        decided = self.chooser.decided(version)
        if decided is not None and await asyncio.to_thread(self._assembly.assembled, version, decided.artifact):
            progress.chunks_present, progress.completed_at = progress.chunks_total, time.time()
            await self._hold(m, progress, decided)  # assembled before a restart: serve it again
            return
        disk_error, choice = await self._assembly.run(version, progress)
        progress.error, progress.reason, progress.completed_at = None, None, time.time()
        if disk_error is not None:
            log.info("%s:%s complete after a write error (%s)", m.name, m.version, disk_error)
        served = m.artifact_named(choice.artifact) or m.served()
        log.info("%s:%s complete (%s, %d bytes)", m.name, m.version, served.artifact, served.total_size)
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
        await self._handoff.serve(m, choice, current.serve_at if current is not None else None)

    async def _serve_held(self, key: Key) -> None:
        """Serve a version assembled before (staged, or waiting for an instant that moved)."""
        version, progress = self._held.get(key), self.progress.get(key)
        choice = self.chooser.decided(version) if version is not None else None
        if version is None or progress is None or choice is None:
            return
        progress.state = "complete"
        await self._handoff.serve(version.manifest, choice, version.serve_at)

    def staged(self) -> list[Key]:
        """Versions assembled and held for a flip, not loaded (the heartbeat says ``staged``)."""
        return [key for key, p in self.progress.items() if p.state == "staged"]

    def failures(self) -> dict[Key, tuple[str, str]]:
        """Every failed version: (name, version) → (reason, message), for the heartbeat."""
        return {
            key: (p.reason or "unknown", p.error or p.reason or "failed")
            for key, p in self.progress.items()
            if p.state == "failed"
        }

    async def stop(self) -> None:
        """Cancel all work."""
        tasks = list(self._tasks.values()) + list(self._seed_tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
