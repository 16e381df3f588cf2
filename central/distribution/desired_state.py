"""Computes each node's desired state and wakes its watch stream on every change.

Every node holds every active version (chunks it owns are seeded); which of them it
serves comes from ``serving`` (the rollout plan: a stable version, or a rollout's).
What a node may read from the origin follows from the same state: every chunk of a version
it serves, the chunks it owns of the others (``allows_chunk``), or what a state sent to it
just before a change allowed (``central.distribution.grants``).

A change (a version committed or deleted, a node joining or leaving) bumps one
generation counter and notifies every stream at once, so edges hear of it within
milliseconds, not on a poll interval.

A served version carries the artifact verdict of the node's hardware class, when a node of
that class has timed the version's artifacts (``verdicts``): the node serves that artifact
and fetches only its chunks. A new verdict is such a change too.

A version that no artifact of which the node's ONNX Runtime loads is neither served nor staged
there; when only some of its artifacts load, the node is told to serve one of those
(``runtime_fit``). ``runtime_refusals`` says which versions a node is refused, and why."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from central.distribution.assignment import NodeHolding, VersionAssignment
from central.distribution.grants import SentLog, SentState
from central.distribution.runtime_fit import RuntimeFit
from central.distribution.verdicts import ArtifactVerdict, VerdictBook
from central.placement import PlacementService
from fleetwire.manifest import Manifest
from fleetwire.transfer import TransferCaps


@dataclass(frozen=True)
class DesiredState:
    """Everything one node must hold, plus where its peers are."""

    generation: int
    versions: list[VersionAssignment]
    peers: dict[str, str] = field(default_factory=dict)
    placement_enabled: bool = True
    #: node id → site of every peer.
    peer_sites: dict[str, str] = field(default_factory=dict)
    #: This node's chunk byte-rate caps (unset ones: the edge's own settings).
    limits: TransferCaps = field(default_factory=TransferCaps)


class DesiredStateService:
    """Owns the generation counter and the placement of the active versions."""

    def __init__(
        self,
        placement: PlacementService,
        active_versions: Callable[[], list[Manifest]],
        peers: Callable[[], dict[str, str]],
        serving: Callable[[str], set[tuple[str, str]]] | None = None,
        grace_s: float = 30.0,
        verdicts: VerdictBook | None = None,
        hardware_class: Callable[[str], str] | None = None,
        peer_sites: Callable[[], dict[str, str]] | None = None,
        limits: Callable[[str], TransferCaps] | None = None,
        holding: Callable[[str], NodeHolding] | None = None,
        runtime_fit: RuntimeFit | None = None,
    ) -> None:
        """``active_versions``: every version some node needs; ``serving(node_id)``: the
        ``(name, version)`` pairs that node serves (None: every active version); ``grace_s``:
        how long a replaced state still lets its node read (a request racing the change);
        ``verdicts`` and ``hardware_class(node_id)``: which artifact each class serves;
        ``peer_sites``: node id → site; ``limits(node_id)``: that node's transfer caps;
        ``holding(node_id)``: the versions it stages, switch instants and forced artifacts;
        ``runtime_fit``: which artifacts each node's runtime loads (None: every one, everywhere)."""
        self._fit = runtime_fit
        self._holding = holding
        self._peer_sites = peer_sites
        self._limits = limits
        self._verdicts = verdicts
        self._hardware_class = hardware_class
        self._placement = placement
        self._serving = serving
        self._active_versions = active_versions
        self._peers = peers
        self._generation = 0
        self._manifests: list[Manifest] = []
        self._keys: frozenset[tuple[str, str]] = frozenset()
        #: What each watching node was sent lately.
        self.sent = SentLog(grace_s)
        self._changed = asyncio.Condition()
        self._notifications: set[asyncio.Task[None]] = set()

    @property
    def manifests(self) -> list[Manifest]:
        """The active versions as of the last ``refresh``."""
        return self._manifests

    @property
    def generation(self) -> int:
        """Bumped by every change."""
        return self._generation

    def refresh(self) -> None:
        """Re-read the active versions, re-place them and wake every watcher."""
        self._manifests = self._active_versions()
        self._keys = frozenset(m.key for m in self._manifests)
        if self._verdicts is not None:
            self._verdicts.keep(self._keys)
        self._placement.set_versions({m.key: [c.digest for c in m.unique_chunks()] for m in self._manifests})
        self._generation += 1
        task = asyncio.get_running_loop().create_task(self._notify())
        self._notifications.add(task)
        task.add_done_callback(self._notifications.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def state_for(self, node_id: str) -> DesiredState:
        """The desired state of ``node_id`` right now."""
        served = self._serving(node_id) if self._serving is not None else None
        hardware_class = self._hardware_class(node_id) if self._hardware_class is not None else ""
        holding = self._holding(node_id) if self._holding is not None else NodeHolding()
        versions = []
        for m in self._manifests:
            serve = served is None or m.key in served
            stage = not serve and m.key in holding.staged
            force = holding.force_artifact.get(m.key) if serve or stage else None
            if (serve or stage) and self._fit is not None:
                fit = self._fit.check(node_id, m)
                if not fit.loadable:  # refused, or being converted: a seed of the chunks it owns
                    serve = stage = False
                force = fit.artifact_for(force)
            versions.append(
                VersionAssignment(
                    manifest=m,
                    serve=serve,
                    placement=self._placement.placement(m.key),
                    verdict=self._verdict(m, hardware_class) if serve or stage else None,
                    stage=stage,
                    serve_at=holding.serve_at.get(m.key) if serve else None,
                    force_artifact=force if serve or stage else None,
                )
            )
        return DesiredState(
            generation=self._generation,
            versions=versions,
            peers=self._peers(),
            placement_enabled=self._placement.enabled,
            peer_sites=self._peer_sites() if self._peer_sites is not None else {},
            limits=self._limits(node_id) if self._limits is not None else TransferCaps(),
        )

    def runtime_refusals(self, node_id: str) -> dict[tuple[str, str], str]:
        """The active versions ``node_id`` would serve or stage but whose artifacts its ONNX
        Runtime cannot load: ``(name, version)`` → why (the per-node failure, reason ``runtime``)."""
        if self._fit is None:
            return {}
        served = self._serving(node_id) if self._serving is not None else None
        staged = self._holding(node_id).staged if self._holding is not None else frozenset()
        refused = {}
        for m in self._manifests:
            if served is not None and m.key not in served and m.key not in staged:
                continue
            refusal = self._fit.check(node_id, m).refusal
            if refusal is not None:
                refused[m.key] = refusal
        return refused

    def _verdict(self, manifest: Manifest, hardware_class: str) -> ArtifactVerdict | None:
        """The verdict for ``manifest`` on ``hardware_class``, if it names one of its artifacts."""
        if self._verdicts is None or not manifest.alternatives:
            return None
        verdict = self._verdicts.get(manifest.key, hardware_class)
        return verdict if verdict is not None and manifest.artifact_named(verdict.artifact) is not None else None

    async def watch(self, node_id: str, since_generation: int = 0) -> AsyncIterator[DesiredState]:
        """The current state, then a new one after every change (coalesced); each is
        recorded in ``sent`` until the watch ends.

        Generations only grow on a stream, and start above ``since_generation`` (what the edge
        holds): an edge refuses a state whose generation does not grow, and it may hold one
        from another replica, or from this central before a restart, whose counter ran ahead
        of this one's. So each state's generation is the larger of the counter and one more
        than the stream's last."""
        seen = -1
        issued = since_generation
        last: SentState | None = None
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda seen=seen: self._generation != seen)  # type: ignore[misc]
                    seen = self._generation
                state = self.state_for(node_id)
                issued = max(state.generation, issued + 1)
                state = dataclasses.replace(state, generation=issued)
                last = SentState.of(node_id, state.versions)
                self.sent.record(node_id, last)
                yield state
        finally:
            if last is not None:
                self.sent.forget(node_id, last)

    def allows_version(self, node_id: str, key: tuple[str, str]) -> bool:
        """Whether ``key`` is in ``node_id``'s desired state: now (every active version is, served
        or seeded), or in one it was sent lately."""
        return key in self._keys or self.sent.allows_version(node_id, key)

    def allows_chunk(self, node_id: str, digest: str) -> bool:
        """Whether ``node_id``'s desired state lets it read ``digest``: a chunk of a version it
        serves, or one it owns (seeds) of another, now or in a state it was sent lately."""
        keys = self._placement.versions_of(digest)
        if keys:
            served = self._serving(node_id) if self._serving is not None else None
            if served is not None and self._holding is not None:
                served = served | self._holding(node_id).staged
            if served is None or any(key in served for key in keys) or self._placement.owns(node_id, digest):
                return True
        return self.sent.allows_chunk(node_id, digest)
