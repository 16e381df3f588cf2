"""Computes each node's desired state and wakes its watch stream on every change.

Every node holds every active version (chunks it owns are seeded); which of them it
serves comes from ``serving`` (the rollout plan: a stable version, or a rollout's).

A change (a version committed or deleted, a node joining or leaving) bumps one
generation counter and notifies every stream at once, so edges hear of it within
milliseconds, not on a poll interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from central.placement import PlacementService
from fleetwire.manifest import Manifest


@dataclass(frozen=True)
class VersionAssignment:
    """One version a node must hold, with the owners of each of its chunks."""

    manifest: Manifest
    serve: bool
    placement: dict[str, list[str]]


@dataclass(frozen=True)
class DesiredState:
    """Everything one node must hold, plus where its peers are."""

    generation: int
    versions: list[VersionAssignment]
    peers: dict[str, str] = field(default_factory=dict)
    placement_enabled: bool = True


class DesiredStateService:
    """Owns the generation counter and the placement of the active versions."""

    def __init__(
        self,
        placement: PlacementService,
        active_versions: Callable[[], list[Manifest]],
        peers: Callable[[], dict[str, str]],
        serving: Callable[[str], set[tuple[str, str]]] | None = None,
    ) -> None:
        """``active_versions``: every version some node needs; ``serving(node_id)``: the
        ``(name, version)`` pairs that node serves (None: every active version)."""
        self._placement = placement
        self._serving = serving
        self._active_versions = active_versions
        self._peers = peers
        self._generation = 0
        self._manifests: list[Manifest] = []
        self._changed = asyncio.Condition()
        self._notifications: set[asyncio.Task[None]] = set()

    @property
    def generation(self) -> int:
        """Bumped by every change."""
        return self._generation

    def refresh(self) -> None:
        """Re-read the active versions, re-place them and wake every watcher."""
        self._manifests = self._active_versions()
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
        versions = [
            VersionAssignment(
                manifest=m, serve=served is None or m.key in served, placement=self._placement.placement(m.key)
            )
            for m in self._manifests
        ]
        return DesiredState(
            generation=self._generation,
            versions=versions,
            peers=self._peers(),
            placement_enabled=self._placement.enabled,
        )

    async def watch(self, node_id: str) -> AsyncIterator[DesiredState]:
        """The current state, then a new one after every change (coalesced)."""
        seen = -1
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda seen=seen: self._generation != seen)  # type: ignore[misc]
                seen = self._generation
            yield self.state_for(node_id)
