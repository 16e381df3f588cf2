"""Rollout test harness: a rollout service over a real node directory, membership tracker and storage,
fed with real heartbeat payloads: the controller's inputs without a fleet."""

from __future__ import annotations

import time
from collections.abc import Iterable
from itertools import count
from pathlib import Path

from central.membership import NodeDirectory, NodeRecord
from central.membership.tracker import MembershipTracker
from central.placement import PlacementService
from central.rollout import DirectoryFleet, RolloutBook, RolloutController, RolloutService
from central.settings import CentralSettings, StoreSettings
from central.storage.factory import open_storage
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.mqtt.payloads import Event, Heartbeat, ModelInfo


class RolloutHarness:
    """Central's rollout parts on ``data_dir`` (or PostgreSQL when ``store.url`` is set); reopen it
    to simulate a restart."""

    def __init__(self, data_dir: Path, store: StoreSettings | None = None) -> None:
        store = store or StoreSettings()
        self.events: list[Event] = []
        self.changes = 0
        self.nodes = NodeDirectory(PlacementService(replicas=2, load_factor=1.25, enabled=True), self._changed)
        self.tracker = MembershipTracker(default_interval_s=60.0)
        storage = open_storage(CentralSettings(data_dir=data_dir, store=store, events={"persist": False}))
        self.registry = storage.metadata
        self._decisions = storage.decisions
        fleet = DirectoryFleet(self.nodes, self.tracker)
        book = RolloutBook(storage.rollouts, self._latest)
        self.controller = RolloutController(
            book, fleet, emit=self.events.append, on_change=self._changed, stuck_after_s=30.0
        )
        self.service = RolloutService(book, self.controller, self.registry, fleet)
        self._seq = count()

    def _changed(self) -> None:
        self.changes += 1

    def _latest(self) -> dict[str, str | None]:
        return {m.name: m.latest for m in self.registry.list_models()}

    def store_version(self, model: str, version: str, *, activate: bool = True) -> None:
        """What a push does to the registry and the release pointer."""
        self.service.before_push(model, activate)
        digest = f"{model}-{version}".encode().hex().ljust(64, "0")[:64]
        manifest = Manifest(
            name=model, version=version, sha256=digest, size=1,
            chunks=[ChunkRef(digest=digest, size=1)], created_at="2026-01-01T00:00:00Z",
        )  # fmt: skip
        self.registry.insert_version(manifest)
        if activate:
            self.service.activated(model, version)

    def add_nodes(self, ids: Iterable[str], **labels: str) -> None:
        for node_id in ids:
            self.nodes.register(NodeRecord(node_id, "127.0.0.1:1", "127.0.0.1:2", labels=dict(labels)))

    def report(self, node_id: str, *models: ModelInfo) -> None:
        """One heartbeat from ``node_id`` listing ``models``."""
        hb = Heartbeat(
            node_id=node_id, bdseq=0, seq=next(self._seq), ts=int(time.time() * 1000), interval_s=60.0,
            models=list(models),
        )  # fmt: skip
        self.tracker.on_heartbeat(node_id, hb)

    def serves(self, node_id: str, model: str = "m") -> str | None:
        """The version of ``model`` that ``node_id`` is told to serve after a re-plan."""
        self.service.active_versions()
        return next((v for m, v in self.service.serving(node_id) if m == model), None)

    def event_types(self) -> list[str]:
        return [e.type for e in self.events]

    def close(self) -> None:
        self.tracker.close()
        self.service.close()
        self.registry.close()
        self._decisions.close()


def ready(version: str, model: str = "m", errors: int = 0) -> ModelInfo:
    return ModelInfo(name=model, version=version, state="ready", errors=errors)


def failed(version: str, model: str = "m") -> ModelInfo:
    return ModelInfo(name=model, version=version, state="failed", error="Fail: cannot create session")
