"""Bug B1's rule on central's real rollout parts (SQLite, node directory, tracker), without
processes: after a restart the stored canaries keep their role while they reconnect, and
lose it only when they do not come back in time or leave after being seen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from central.membership import NodeDirectory, NodeRecord
from central.membership.tracker import MembershipTracker
from central.placement import PlacementService
from central.rollout import DirectoryFleet, RolloutBook, RolloutController, RolloutRequest, RolloutService
from central.rollout.controller import CANARY_RETURN_S
from central.storage.sqlite.database import SQLiteDatabase
from central.storage.sqlite.registry import SQLiteMetadataStore
from central.storage.sqlite.rollouts import SQLiteRolloutStore
from fleetwire.manifest import ChunkRef, Manifest

NODES = ["n0", "n1", "n2", "n3"]


class Central:
    """Central's rollout parts on ``data_dir``; a new one on the same dir is a restart."""

    def __init__(self, data_dir: Path) -> None:
        self.nodes = NodeDirectory(PlacementService(replicas=2, load_factor=1.25, enabled=True), lambda: None)
        self.tracker = MembershipTracker(default_interval_s=60.0)
        db = SQLiteDatabase(data_dir / "central.sqlite3")
        self.registry = SQLiteMetadataStore(db)
        fleet = DirectoryFleet(self.nodes, self.tracker)
        book = RolloutBook(SQLiteRolloutStore(db), self._latest)
        self.controller = RolloutController(book, fleet, emit=lambda _: None, on_change=lambda: None)
        self.service = RolloutService(book, self.controller, self.registry, fleet)

    def _latest(self) -> dict[str, str | None]:
        return {m.name: m.latest for m in self.registry.list_models()}

    def store_version(self, version: str, *, activate: bool) -> None:
        self.service.before_push("m", activate)
        digest = f"m-{version}".encode().hex().ljust(64, "0")[:64]
        manifest = Manifest(name="m", version=version, sha256=digest, size=1,
                            chunks=[ChunkRef(digest=digest, size=1)], created_at="2026-01-01T00:00:00Z")  # fmt: skip
        self.registry.insert_version(manifest)
        if activate:
            self.service.activated("m", version)

    def register(self, *node_ids: str) -> None:
        for node_id in node_ids:
            self.nodes.register(NodeRecord(node_id, "127.0.0.1:1", "127.0.0.1:2"))

    def serves(self, node_id: str) -> str | None:
        self.service.active_versions()
        return dict(self.service.serving(node_id)).get("m")

    def canaries(self, now: float) -> list[str]:
        self.controller.evaluate_all(now)
        return self.service.get("m").canary_nodes

    def close(self) -> None:
        self.tracker.close()
        self.service.close()
        self.registry.close()


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[str]:
    """A rollout of m:2 to a quarter of four nodes, stored by a central that then went away."""
    first = Central(tmp_path)
    first.store_version("1", activate=True)
    first.store_version("2", activate=False)
    first.register(*NODES)
    (chosen,) = first.service.start("m", RolloutRequest(version="2", canary=0.25)).canary_nodes
    first.close()
    yield chosen


async def test_a_canary_reconnecting_last_keeps_its_role_until_it_is_overdue(tmp_path: Path, canary: str) -> None:
    central = Central(tmp_path)
    others = [n for n in NODES if n != canary]
    central.register(*others)  # every other node is back first
    now = time.time()
    assert central.canaries(now + 1) == [canary]
    assert [central.serves(n) for n in [canary, *others]] == ["2", "1", "1", "1"]
    central.register(canary)
    assert central.canaries(now + 2) == [canary]

    late = Central(tmp_path)  # restarted again; this time the canary never comes back
    late.register(*others)
    assert late.canaries(now + CANARY_RETURN_S - 1) == [canary]
    (replacement,) = late.canaries(now + CANARY_RETURN_S + 1)
    assert replacement in others
    late.close()
    central.close()


async def test_a_canary_that_leaves_after_the_restart_is_replaced_at_once(tmp_path: Path, canary: str) -> None:
    central = Central(tmp_path)
    central.register(*NODES)
    now = time.time()
    assert central.canaries(now) == [canary]
    central.nodes.unregister(canary)
    (replacement,) = central.canaries(now + 1)
    assert replacement != canary
    central.close()
