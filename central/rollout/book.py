"""The rollouts and release pointers in memory, written through to a ``RolloutRecords`` store.

Everything runs on central's loop; SQLite writes are small and synchronous, so a
state change is durable before anyone is told about it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from central.rollout.model import Rollout
from central.rollout.plan import ServingPlan
from central.storage.protocols import Release, RolloutRecords


@dataclass(frozen=True)
class RolloutState:
    """The rollouts and release pointers as stored (``RolloutBook.read``), and how many writes
    the book had made when the read began."""

    writes: int
    rollouts: dict[int, Rollout]
    releases: dict[str, Release]


class RolloutBook:
    """Every rollout (oldest first) and every model's release pointer."""

    def __init__(
        self,
        store: RolloutRecords,
        latest_versions: Callable[[], dict[str, str | None]],
        on_write: Callable[[], None] | None = None,
    ) -> None:
        """``on_write``: after every write (a replicated central tells the other replicas to re-read)."""
        self._store = store
        self._on_write = on_write or (lambda: None)
        self._latest_versions = latest_versions
        self._rollouts: dict[int, Rollout] = {r.id: r for r in store.all()}
        self._releases: dict[str, Release] = store.releases()
        self._fence: int | None = None
        #: Writes made through this book: a read begun before one is not adopted over it.
        self._writes = 0

    @contextmanager
    def fenced(self, epoch: int | None) -> Iterator[None]:
        """Every ``save`` inside is made as the leader at ``epoch`` (None: unfenced): the
        store refuses it once another replica leads (a controller pass of a deposed leader)."""
        self._fence = epoch
        try:
            yield
        finally:
            self._fence = None

    def reload(self) -> None:
        """Re-read every rollout and release pointer: another replica of a replicated central
        (the leader's controller, or an operator's call there) changed them."""
        self.adopt(self.read())

    def read(self) -> RolloutState:
        """Every rollout and release pointer as stored (store reads only: any thread)."""
        writes = self._writes
        return RolloutState(writes, {r.id: r for r in self._store.all()}, self._store.releases())

    def adopt(self, state: RolloutState) -> bool:
        """Take what ``read`` read (on the loop), unless this book wrote meanwhile: the read may
        predate that write, whose generation bump has every replica, this one too, read again."""
        if state.writes != self._writes:
            return False
        self._rollouts, self._releases = state.rollouts, state.releases
        return True

    def rollouts(self, model: str | None = None) -> list[Rollout]:
        """Rollouts, oldest first (of ``model`` only when given)."""
        return [r for r in self._rollouts.values() if model is None or r.model == model]

    def in_progress(self, model: str | None = None) -> list[Rollout]:
        """Rollouts in canary or rolling state."""
        return [r for r in self.rollouts(model) if r.in_progress]

    def epoch(self, model: str) -> int:
        """The last rollout id of ``model`` that a plain push superseded."""
        release = self._releases.get(model)
        return release.epoch if release else 0

    def has_release(self, model: str) -> bool:
        """Whether ``model``'s stable version is pinned (else it is the latest version)."""
        return model in self._releases

    def add(self, rollout: Rollout) -> Rollout:
        """Store a new rollout and give it its id."""
        stored = self._store.insert(rollout)
        self._rollouts[stored.id] = stored
        self._writes += 1
        self._on_write()
        return stored

    def save(self, rollout: Rollout) -> None:
        """Persist a changed rollout, then keep it: a write the store refuses (``StaleRollout``:
        another replica wrote it meanwhile; ``Fenced``: this one no longer leads) leaves the book
        as it was, and nobody is told of a step that did not happen."""
        self._store.update(rollout, self._fence)
        self._rollouts[rollout.id] = rollout
        self._writes += 1
        self._on_write()

    def set_release(self, model: str, stable: str | None, *, supersede: bool) -> None:
        """Pin ``model``'s stable version; ``supersede`` retires every rollout so far."""
        epoch = max((r.id for r in self.rollouts(model)), default=0) if supersede else self.epoch(model)
        self._store.set_release(model, stable, epoch)
        self._releases[model] = Release(model, stable, epoch)
        self._writes += 1
        self._on_write()

    def write_release(self, model: str, stable: str) -> None:
        """Write ``model``'s release pointer to the store only, superseding every rollout stored so
        far: a plain push's activation inside the push's transaction (a worker thread, so the
        in-memory book is left to ``set_release`` on the loop right after)."""
        self._store.set_release(model, stable, self._store.max_id(model))

    def plan(self) -> ServingPlan:
        """The serving plan of this moment (reads the registry's latest versions)."""
        stable = dict(self._latest_versions())
        stable.update({m: r.stable for m, r in self._releases.items() if m in stable})
        epochs = {m: r.epoch for m, r in self._releases.items()}
        return ServingPlan(stable, epochs, [r for r in self._rollouts.values() if r.model in stable])

    def close(self) -> None:
        """Close the store."""
        self._store.close()
