"""Which artifact of a version runs fastest on each hardware class, as edges measured it.

The first node of a class times a version's artifacts and reports its choice in every
heartbeat (``ModelInfo.choice``). Central keeps the first such verdict per (model,
version, hardware class) and puts it in the desired state of every node of that class
(``VersionAssignment.verdict``), which then fetches only the chosen artifact instead of
timing them all. First one wins: a verdict never flips under nodes already serving it.

Kept (``DecisionRecords``, kind ``verdict``) so that a restart, and on replicas every replica
and the next leader, keeps each class's verdict: the store, not the process that heard it,
says which of two racing first verdicts stands (an insert that keeps the first; every replica
takes it on its next read). In memory only for active versions, bounded (``max_entries``,
oldest dropped first); the stored rows stay, one per version and class.
A choice counts only when the node's heartbeat and its registration name the same class,
so a node cannot speak for a class it did not register with; a verdict is attributed to the
node whose heartbeat reported it (``from_node`` in a heartbeat is the edge's own story and is
never believed), so no node can put a verdict in another's name.

Heard on the event loop (``harvest`` is a heartbeat watcher), a new verdict is stored off it:
with ``calls`` (central's ``StoreCalls``) it is queued and a background task stores the queue
in worker threads, keeping each verdict once stored (a conflict re-reads the stored ones in a
worker too); without, it is stored inline (tests of the book alone)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from central.storage.memory import MemoryDecisionRecords
from central.storage.offload import StoreCalls
from central.storage.protocols import DecisionRecords
from fleetwire.mqtt.fast import AnyHeartbeat

_log = logging.getLogger(__name__)

__all__ = ["MAX_VERDICTS", "SHARED_SOURCES", "ArtifactVerdict", "VerdictBook"]

#: Verdicts kept at most (one per model version and hardware class: a fleet has few classes).
MAX_VERDICTS = 4096
#: Choice sources that are timings, first-hand or passed on; pins and defaults are not.
SHARED_SOURCES = frozenset({"measured", "verdict"})

VersionKey = tuple[str, str]
#: The ``DecisionRecords`` kind.
KIND = "verdict"


@dataclass(frozen=True)
class ArtifactVerdict:
    """The artifact a node of ``hardware_class`` timed fastest, and by how much."""

    artifact: str
    hardware_class: str
    node_id: str
    speedup_b1: float | None = None
    speedup_b8: float | None = None
    at: float = 0.0
    """Unix time central heard it."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return asdict(self)


class VerdictBook:
    """(model, version, hardware class) → the first verdict heard, for the active versions."""

    def __init__(
        self,
        registered_class: Callable[[str], str | None],
        on_new: Callable[[], None] | None = None,
        max_entries: int = MAX_VERDICTS,
        records: DecisionRecords | None = None,
        calls: StoreCalls | None = None,
    ) -> None:
        """``registered_class(node_id)``: the class a node registered with (None: unknown);
        ``on_new``: called after a verdict is first recorded (desired states change);
        ``records``: where verdicts are kept (None: memory only); ``calls``: where new verdicts
        are stored, from a background task (None: inline, in ``record``)."""
        self._calls = calls
        #: Verdicts heard, not yet stored (``calls`` only), and the task storing them.
        self._queued: dict[tuple[str, str, str], ArtifactVerdict] = {}
        self._storing: asyncio.Task[None] | None = None
        self._registered_class = registered_class
        self._on_new = on_new
        self._max = max_entries
        self._records: DecisionRecords = records if records is not None else MemoryDecisionRecords()
        self._verdicts: dict[tuple[str, str, str], ArtifactVerdict] = {}
        self._active: frozenset[VersionKey] | None = None
        self.reload()

    def reload(self) -> None:
        """Take the stored verdicts (of active versions), oldest first."""
        self.adopt(self.read_stored())

    def read_stored(self) -> dict[str, Any]:
        """The stored verdicts (a store read: any thread; ``adopt`` them on the loop)."""
        return self._records.load(KIND)

    def adopt(self, raw: dict[str, Any]) -> None:
        """Take what ``read_stored`` read: those of active versions, oldest first."""
        stored = []
        for raw_key, body in raw.items():
            model, version, _ = json.loads(raw_key)
            if self._active is None or (model, version) in self._active:
                stored.append(((model, version), ArtifactVerdict(**body)))
        stored.sort(key=lambda kv: kv[1].at)
        verdicts = {(k[0], k[1], v.hardware_class): v for k, v in stored[-self._max :]} if self._max else {}
        self._verdicts = verdicts

    def __len__(self) -> int:
        return len(self._verdicts)

    def get(self, key: VersionKey, hardware_class: str) -> ArtifactVerdict | None:
        """The verdict for a version on a class, or None: nodes of it time the artifacts."""
        return self._verdicts.get((key[0], key[1], hardware_class)) if hardware_class else None

    def record(self, key: VersionKey, verdict: ArtifactVerdict) -> bool:
        """Keep ``verdict`` unless the version is not active or its class has one already: at
        once without ``calls``; else queued, kept once stored (True: kept or queued)."""
        book_key = (key[0], key[1], verdict.hardware_class)
        if book_key in self._verdicts or book_key in self._queued:
            return False
        if self._active is not None and key not in self._active:
            return False
        if self._calls is None:
            return self._store(book_key, verdict)
        self._queued[book_key] = verdict
        if self._storing is None:
            self._storing = asyncio.get_running_loop().create_task(self._store_queued(), name="verdicts")
        return True

    def _store(self, book_key: tuple[str, str, str], verdict: ArtifactVerdict) -> bool:
        """Store ``verdict`` inline and keep it (False: not stored, or another came first)."""
        try:
            stored = self._records.add(KIND, json.dumps(list(book_key)), verdict.as_dict())
        except Exception as exc:  # the store away: the node reports it again next beat
            _log.warning("verdict for %s not stored (%s)", book_key, exc)
            return False
        if not stored:  # another replica's came first: take that one
            self.reload()
            return False
        return self._keep(book_key, verdict)

    async def _store_queued(self) -> None:
        """Store the queued verdicts one by one in ``calls``' threads; keep each on the loop."""
        assert self._calls is not None
        try:
            while self._queued:
                book_key, verdict = next(iter(self._queued.items()))
                try:
                    stored = await self._calls(self._records.add, KIND, json.dumps(list(book_key)), verdict.as_dict())
                except Exception as exc:  # the store away: the node reports it again next beat
                    _log.warning("verdict for %s not stored (%s)", book_key, exc)
                    continue
                finally:
                    self._queued.pop(book_key, None)
                if stored:
                    self._keep(book_key, verdict)
                    continue
                try:  # another replica's came first: take that one
                    self.adopt(await self._calls(self.read_stored))
                except Exception as exc:
                    _log.warning("stored verdicts not read (%s)", exc)
        finally:
            self._storing = None

    def _keep(self, book_key: tuple[str, str, str], verdict: ArtifactVerdict) -> bool:
        """Keep a stored verdict (unless its version went inactive, or a re-read brought it)."""
        if book_key in self._verdicts or (self._active is not None and book_key[:2] not in self._active):
            return False
        while self._verdicts and len(self._verdicts) >= self._max:
            del self._verdicts[next(iter(self._verdicts))]
        if self._max <= 0:
            return False
        self._verdicts[book_key] = verdict
        if self._on_new is not None:
            self._on_new()
        return True

    def close(self) -> None:
        """Stop storing the queue (the verdicts in it are heard again from the next beats)."""
        if self._storing is not None:
            self._storing.cancel()
            self._storing = None

    def harvest(self, node_id: str, hb: AnyHeartbeat) -> None:
        """Record the timed choices a heartbeat reports for versions it serves (ready)."""
        for m in hb.models:
            c = m.choice
            if c is None or c.source not in SHARED_SOURCES or m.state != "ready":
                continue
            if (m.name, m.version, c.hardware_class) in self._verdicts:
                continue
            if not c.hardware_class or c.hardware_class != hb.hardware_class:
                continue
            if self._registered_class(node_id) != c.hardware_class:
                continue
            verdict = ArtifactVerdict(
                artifact=c.artifact,
                hardware_class=c.hardware_class,
                node_id=node_id,  # its reporter: a node cannot put its word in another's mouth
                speedup_b1=c.speedup_b1,
                speedup_b8=c.speedup_b8,
                at=time.time(),
            )
            self.record((m.name, m.version), verdict)

    def keep(self, active: Iterable[VersionKey]) -> None:
        """Only versions in ``active`` keep (and get) verdicts from now on."""
        self._active = frozenset(active)
        for book_key in [k for k in self._verdicts if (k[0], k[1]) not in self._active]:
            del self._verdicts[book_key]

    def all(self) -> list[dict[str, Any]]:
        """Every verdict, with its model and version, for the API."""
        return [{"model": k[0], "version": k[1], **v.as_dict()} for k, v in self._verdicts.items()]
