"""Which version of each model a node serves: the layering of stable versions and rollouts.

Per model, the newest rollout in effect whose wave holds the node wins (a canary only
for its canary nodes; a promoted or complete rollout for every node its selector
matches); a node no rollout covers serves the model's stable version. Rolled-back
rollouts, and those a plain push superseded (id up to the release's ``epoch``), drop out."""

from __future__ import annotations

from collections.abc import Iterable

from central.rollout.model import IN_EFFECT, Rollout


class ServingPlan:
    """A snapshot of the layering, cheap to ask once per node and model."""

    def __init__(self, stable: dict[str, str | None], epochs: dict[str, int], rollouts: Iterable[Rollout]) -> None:
        self._stable = dict(stable)
        self._layers: dict[str, list[Rollout]] = {}
        for r in sorted(rollouts, key=lambda r: r.id, reverse=True):
            if r.state in IN_EFFECT and r.id > epochs.get(r.model, 0):
                self._layers.setdefault(r.model, []).append(r)
        for model in self._layers:
            self._stable.setdefault(model, None)

    @property
    def models(self) -> list[str]:
        """Every model the plan knows, by name."""
        return sorted(self._stable)

    def stable(self, model: str) -> str | None:
        """The version nodes serve when no rollout covers them."""
        return self._stable.get(model)

    def version_for(self, model: str, node_id: str, labels: dict[str, str], *, below: int | None = None) -> str | None:
        """The version of ``model`` that ``node_id`` serves (None: none). ``below``
        ignores rollouts with that id or newer (what the node served before them)."""
        for r in self._layers.get(model, []):
            if (below is None or r.id < below) and r.in_wave(node_id, labels):
                return r.version
        return self._stable.get(model)

    def holding(
        self, node_id: str, labels: dict[str, str]
    ) -> tuple[set[tuple[str, str]], dict[tuple[str, str], float]]:
        """What ``node_id`` holds beyond what it serves: ``(model, version)`` it stages (a staged
        rollout before its flip) and, per served version with one, the instant it switches."""
        staged: set[tuple[str, str]] = set()
        serve_at: dict[tuple[str, str], float] = {}
        for model, layers in self._layers.items():
            serving = None
            for r in layers:
                if serving is None and r.in_wave(node_id, labels):
                    serving = r
                elif r.stages(node_id, labels):
                    staged.add((model, r.version))
            if serving is not None and (at := serving.serve_at(node_id)) is not None:
                serve_at[(model, serving.version)] = at
        return staged, serve_at

    def versions_needed(self, model: str) -> set[str]:
        """Every version some node may serve: the stable one and each layer's."""
        needed = {r.version for r in self._layers.get(model, [])}
        stable = self._stable.get(model)
        return needed | {stable} if stable is not None else needed

    def serving(self, node_id: str, labels: dict[str, str]) -> set[tuple[str, str]]:
        """``(model, version)`` of everything ``node_id`` serves."""
        out = set()
        for model in self._stable:
            version = self.version_for(model, node_id, labels)
            if version is not None:
                out.add((model, version))
        return out
