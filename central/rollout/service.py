"""The operator's side of rollouts: start, promote, roll back, list; plus the hooks the
push route and the desired-state service use to ask what each node serves."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from central.distribution.assignment import NodeHolding
from central.errors import Conflict, NotFound
from central.rollout.book import RolloutBook
from central.rollout.controller import RolloutController
from central.rollout.cost import RolloutPreview
from central.rollout.fleet import FleetView
from central.rollout.labels import matches
from central.rollout.model import IN_EFFECT, Rollout, RolloutRequest, utc
from central.rollout.plan import ServingPlan
from central.rollout.previewer import RolloutPreviewer
from central.storage.protocols import MetadataStore, StaleRollout
from fleetwire.manifest import Manifest


class RolloutService:
    """Staged rollouts of stored versions, and the stable version of every model."""

    def __init__(
        self,
        book: RolloutBook,
        controller: RolloutController,
        store: MetadataStore,
        fleet: FleetView,
        previewer: RolloutPreviewer | None = None,
    ) -> None:
        """``previewer``: answers ``preview`` (dry runs); None: they get a 404."""
        self._previewer = previewer
        self._book = book
        self._controller = controller
        self._store = store
        self._fleet = fleet
        self._plan: ServingPlan | None = None
        #: node id → version → the artifact it must serve (central's INT8 fallbacks; none by default).
        self.forced: Callable[[str], dict[tuple[str, str], str]] = lambda node_id: {}

    # -- operator API -------------------------------------------------------------------

    def start(self, model: str, request: RolloutRequest, actor: str | None = None) -> Rollout:
        """Begin rolling ``request.version`` out; its canaries are chosen at once. ``actor``
        (the operator's token name) goes into the events of this and the calls below."""
        if self._store.get_version(model, request.version) is None:
            raise NotFound(f"model {model!r} has no version {request.version!r}")
        previous = self._previous_version(model, request.selector)
        refusal = self._refusal(model, request, previous)
        if refusal is not None:
            raise Conflict(refusal)
        r = self._book.add(Rollout(model=model, previous_version=previous, **request.model_dump()))
        self._controller.transition(r, "staging" if r.stage else "canary", None, "rollout_started", actor)
        return self._controller.evaluate(self._book_get(r.id), time.time())

    def preview(self, model: str, request: RolloutRequest) -> RolloutPreview:
        """What ``start`` would make every node fetch, and from where; writes nothing. A start
        that would be refused is previewed all the same, with the reason in ``refused``."""
        if self._previewer is None:
            raise NotFound("rollout previews are not available on this central")
        if self._store.get_version(model, request.version) is None:
            raise NotFound(f"model {model!r} has no version {request.version!r}")
        previous = self._previous_version(model, request.selector)
        return self._previewer.preview(model, request, previous, self._refusal(model, request, previous))

    def _refusal(self, model: str, request: RolloutRequest, previous: str | None) -> str | None:
        """Why a rollout of ``request`` cannot start now (a 409), or None."""
        if running := self._book.in_progress(model):
            r = running[-1]
            return f"rollout {r.id} of {model} to version {r.version} is in progress ({r.state})"
        if previous == request.version:
            return f"the selected nodes already serve {model} version {request.version}"
        now = time.time()
        if request.flip_at is not None and request.flip_at.timestamp() < now:
            return (
                f"the flip instant {request.flip_at.isoformat()} has passed (central's clock: {utc(now).isoformat()})"
            )
        return None

    def promote(self, model: str, actor: str | None = None) -> Rollout:
        """Send the canary rollout of ``model`` to every selected node; 409 unless in canary."""
        return self._fresh(lambda: self._promote(model, actor))

    def _promote(self, model: str, actor: str | None = None) -> Rollout:
        r = self.get(model)
        if r.scheduled and r.in_progress and not r.stage:
            if r.wave >= len(r.wave_sizes) - 1:
                raise Conflict(f"rollout {r.id} of {model} is in its last wave; nothing to promote")
            return self._controller.next_wave(r, "promoted by the operator", actor)
        if r.state != "canary":
            raise Conflict(f"rollout {r.id} of {model} is {r.state}, not canary; nothing to promote")
        return self._controller.transition(r, "rolling", "promoted by the operator", "rollout_promoted", actor)

    def retry(self, model: str, nodes: list[str] | None = None, actor: str | None = None) -> Rollout:
        """Count the failed ``nodes`` (None: all of them) of ``model``'s rollout in progress again;
        their edges retry on the new desired state. 409 when nothing failed or it is not in progress."""
        return self._fresh(lambda: self._retry(model, nodes, actor))

    def _retry(self, model: str, nodes: list[str] | None = None, actor: str | None = None) -> Rollout:
        r = self.get(model)
        if not r.in_progress:
            raise Conflict(f"rollout {r.id} of {model} is {r.state}; only a rollout in progress retries nodes")
        unknown = sorted(set(nodes or ()) - set(r.nodes))
        if unknown:
            raise NotFound(f"rollout {r.id} of {model} has no node {', '.join(unknown)}")
        if not self._controller.retry(r, nodes, actor):
            raise Conflict(f"rollout {r.id} of {model} has no failed node to retry")
        return self._book_get(r.id)

    def flip(self, model: str, at: float | None = None, actor: str | None = None) -> Rollout:
        """Switch the staged rollout of ``model`` at ``at`` (Unix seconds, central's clock; None:
        ``lead_s`` from now, the least that reaches every node first). 409 unless it is staging, or
        flipping with its instant still ahead (the flip moves)."""
        return self._fresh(lambda: self._flip(model, at, actor))

    def _flip(self, model: str, at: float | None = None, actor: str | None = None) -> Rollout:
        r = self.get(model)
        now = time.time()
        if r.state not in ("staging", "flipping"):
            raise Conflict(f"rollout {r.id} of {model} is {r.state}, not staged; nothing to flip")
        if r.state == "flipping" and (r.flip_instant or 0.0) <= now:
            raise Conflict(f"rollout {r.id} of {model} flipped already")
        lead = self._controller.flip_rules.lead_s
        if at is None:
            at = now + lead
        elif at < now:
            raise Conflict(
                f"the flip instant {utc(at).isoformat()} has passed (central's clock: {utc(now).isoformat()})"
            )
        return self._controller.flip(r, at, actor)

    def _fresh(self, act: Callable[[], Rollout]) -> Rollout:
        """An operator's action; when another replica wrote the rollout since this one read it
        (``StaleRollout``: nothing was written), read the rollouts again and decide once more
        on what it wrote (a promote of a rollout the leader just completed is then a 409)."""
        try:
            return act()
        except StaleRollout:
            self._book.reload()
            return act()

    def holding(self, node_id: str) -> NodeHolding:
        """What ``node_id`` stages, the instants it switches at, and artifacts it must serve."""
        plan = self._plan or self._plan_now()
        staged, serve_at = plan.holding(node_id, self._fleet.labels_of(node_id))
        return NodeHolding(staged=frozenset(staged), serve_at=serve_at, force_artifact=self.forced(node_id))

    def roll_back_version(self, model: str, version: str, reason: str) -> bool:
        """Roll back the rollout in effect that brought ``model:version`` (False: none did)."""
        epoch = self._book.epoch(model)
        effective = [r for r in self._book.rollouts(model) if r.state in IN_EFFECT and r.id > epoch]
        if not effective or effective[-1].version != version or effective[-1].previous_version is None:
            return False
        self._controller.transition(effective[-1], "rolled_back", reason, "rollout_rolled_back")
        return True

    def rollback(self, model: str, reason: str = "rolled back by the operator", actor: str | None = None) -> Rollout:
        """Take the in-progress or latest completed rollout of ``model`` back."""
        return self._fresh(lambda: self._rollback(model, reason, actor))

    def _rollback(self, model: str, reason: str = "rolled back by the operator", actor: str | None = None) -> Rollout:
        epoch = self._book.epoch(model)
        effective = [r for r in self._book.rollouts(model) if r.state in IN_EFFECT and r.id > epoch]
        if not effective:
            raise Conflict(f"{model} has no rollout in progress or completed to roll back")
        r = effective[-1]
        if r.previous_version is None:
            raise Conflict(f"rollout {r.id} of {model} has no previous version to go back to")
        return self._controller.transition(r, "rolled_back", reason, "rollout_rolled_back", actor)

    def all(self) -> list[Rollout]:
        """Every rollout, newest first."""
        return sorted(self._book.rollouts(), key=lambda r: r.id, reverse=True)

    def get(self, model: str) -> Rollout:
        """``model``'s in-progress rollout, else its latest; 404 when it never had one."""
        rollouts = self._book.rollouts(model)
        if not rollouts:
            raise NotFound(f"model {model!r} has no rollout")
        running = [r for r in rollouts if r.in_progress]
        return (running or rollouts)[-1]

    # -- push and delete hooks ------------------------------------------------------------

    def before_push(self, model: str, activate: bool) -> None:
        """Refuse a plain push during a rollout; pin the stable version before a stored-only one."""
        if activate:
            if running := self._book.in_progress(model):
                raise Conflict(
                    f"rollout {running[-1].id} of {model} is in progress; promote or roll it back,"
                    " or push with activate=false"
                )
        elif not self._book.has_release(model):
            self._book.set_release(model, self._plan_now().stable(model), supersede=False)

    def activation(self, model: str) -> Callable[[str], None]:
        """What a plain push of ``model`` writes in its version's transaction (the registry calls
        it with the version, in a worker thread): the release pointer, so the version and its
        activation commit together. ``activated`` then does the rest on the loop."""
        return lambda version: self._book.write_release(model, version)

    def activated(self, model: str, version: str, actor: str | None = None) -> None:
        """A plain push (by ``actor``): ``version`` is what every node serves now, past rollouts aside."""

        def supersede() -> None:
            for r in self._book.in_progress(model):  # one started while the push was running
                reason = f"superseded by a push of version {version}"
                self._controller.transition(r, "rolled_back", reason, "rollout_rolled_back", actor)

        try:  # the version is committed already: re-read rather than answer the push with a 409
            supersede()
        except StaleRollout:
            self._book.reload()
            supersede()
        self._book.set_release(model, version, supersede=True)

    def check_deletable(self, model: str, version: str) -> None:
        """409 when some node serves or may serve ``version``."""
        if version in self._plan_now().versions_needed(model):
            raise Conflict(f"{model}:{version} is served by nodes or part of a rollout; roll it back first")

    # -- desired state ----------------------------------------------------------------------

    def active_versions(self) -> list[Manifest]:
        """Every version some node serves or may serve soon (re-plans; called per refresh)."""
        self._plan = plan = self._book.plan()
        out = []
        for model in plan.models:
            for version in sorted(plan.versions_needed(model)):
                record = self._store.get_version(model, version)
                if record is not None:
                    out.append(record.manifest)
        return out

    def serving(self, node_id: str) -> set[tuple[str, str]]:
        """``(model, version)`` pairs ``node_id`` serves under the last plan."""
        plan = self._plan or self._plan_now()
        return plan.serving(node_id, self._fleet.labels_of(node_id))

    def _plan_now(self) -> ServingPlan:
        return self._book.plan()

    def _previous_version(self, model: str, selector: dict[str, str]) -> str | None:
        """What the selected nodes serve now (the most common answer), else the stable version."""
        plan = self._plan_now()
        served = Counter(
            plan.version_for(model, node_id, labels)
            for node_id, labels in self._fleet.labels().items()
            if matches(selector, labels)
        )
        served.pop(None, None)
        return served.most_common(1)[0][0] if served else plan.stable(model)

    def _book_get(self, rollout_id: int) -> Rollout:
        return next(r for r in self._book.rollouts() if r.id == rollout_id)

    def close(self) -> None:
        """Stop the controller and close the store."""
        self._controller.stop()
        self._book.close()
