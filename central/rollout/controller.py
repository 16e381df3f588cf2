"""Moves rollouts on: every ``interval_s`` (and on membership changes) it refreshes each
in-progress rollout's progress from the fleet's heartbeats and acts on the verdict:
promote after a healthy soak, complete, or abort and roll back past the threshold.

State transitions live here too, so the operator's promote and rollback and the
controller's own take the same path: persist, tell the event log, re-plan the fleet."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from central.rollout import flip, scheduled
from central.rollout.book import RolloutBook
from central.rollout.fleet import FleetView
from central.rollout.labels import matches
from central.rollout.model import Rollout, RolloutState, utc
from central.rollout.progress import NextStep, choose_canaries, decide, node_progress, retry, settle, tally
from central.storage.protocols import StaleRollout
from fleetwire.mqtt.payloads import Event

log = logging.getLogger(__name__)

#: How long after central starts a canary that has not registered again keeps its role:
#: right after a restart no node is registered, and a canary that merely reconnects
#: later than another target must not lose the role to it (it would swap back).
CANARY_RETURN_S = 30.0


class RolloutController:
    """Evaluates in-progress rollouts periodically; owns their state transitions."""

    def __init__(
        self,
        book: RolloutBook,
        fleet: FleetView,
        *,
        emit: Callable[[Event], None],
        on_change: Callable[[], None],
        interval_s: float = 0.5,
        stuck_after_s: float = 60.0,
        canary_return_s: float = CANARY_RETURN_S,
        leading: Callable[[], bool] | None = None,
        epoch: Callable[[], int | None] | None = None,
        flip_rules: flip.FlipRules | None = None,
    ) -> None:
        """``leading``: a pass runs only while it says so (a replica that lost the leadership
        writes nothing more); ``epoch``: the leader epoch every write of a pass is fenced by
        (a replica paused past its lease, that has not noticed yet, writes nothing either).
        A pass reads nothing first: a change made on another replica reaches the book through
        the fleet generation (``RolloutBook.reload``), and a write made on a stale book is
        refused (``StaleRollout``), re-read, and decided again at the next pass."""
        self._leading = leading
        self._epoch = epoch
        self.flip_rules = flip_rules or flip.FlipRules()
        self._book = book
        self._fleet = fleet
        self._emit = emit
        self._on_change = on_change
        self.interval_s = interval_s
        self.stuck_after_s = stuck_after_s
        self.canary_return_s = canary_return_s
        self._started_at = time.time()
        #: Nodes seen among a rollout's targets since this central started.
        self._seen: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._poked = False

    def start(self) -> None:
        """Send ``rollout_resumed`` for each rollout in progress (one this central picks up
        from its store), then evaluate now and every ``interval_s`` (needs the running loop)."""
        for r in self._book.in_progress():
            self._emit(rollout_event("rollout_resumed", r, f"resumed in state {r.state}"))
        self._tick()

    def stop(self) -> None:
        """Stop evaluating."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def poke(self) -> None:
        """Evaluate soon (coalesced: a storm of membership transitions costs one pass); only
        while started (a follower replica never evaluates)."""
        if self._poked or self._timer is None or not self._book.in_progress():
            return
        self._poked = True
        asyncio.get_running_loop().call_soon(self._poked_pass)

    def _poked_pass(self) -> None:
        self._poked = False
        self._evaluate_logged()

    def _tick(self) -> None:
        self._evaluate_logged()
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _evaluate_logged(self) -> None:
        try:
            self.evaluate_all()
        except StaleRollout as exc:  # another replica wrote it: decide again on what it wrote
            log.info("%s; re-reading the rollouts", exc)
            self._book.reload()
        except Exception:  # one bad evaluation must not stop the timer
            log.exception("rollout evaluation failed")

    def evaluate_all(self, now: float | None = None) -> None:
        """Evaluate every in-progress rollout once, every write fenced by the leader epoch."""
        if self._leading is not None and not self._leading():
            return
        with self._book.fenced(self._epoch() if self._epoch is not None else None):
            for rollout in self._book.in_progress():
                self.evaluate(rollout, time.time() if now is None else now)

    def evaluate(self, rollout: Rollout, now: float) -> Rollout:
        """Refresh ``rollout``'s progress, act on the verdict, persist what changed."""
        labels = self._fleet.labels()
        r = rollout.model_copy(deep=True)
        r.targets = sorted(n for n, node_labels in labels.items() if matches(r.selector, node_labels))
        if r.stage:
            return self._evaluate_staged(r, rollout, now)
        if r.scheduled:
            return self._evaluate_scheduled(r, rollout, labels, now)
        waves_changed = self._pick_canaries(r, now)
        errors = self._refresh_nodes(r, rollout, now)
        r.healthy_since = self._healthy_since(r, now)
        verdict = decide(r, now, errors)
        if verdict.decision == "promote":
            return self.transition(r, "rolling", "promoted after a healthy soak", "rollout_promoted")
        return self._conclude(r, rollout, verdict, now, waves_changed)

    def _conclude(self, r: Rollout, before: Rollout, verdict: NextStep, now: float, replan: bool) -> Rollout:
        """Act on ``verdict`` (roll back, complete, or wait), persist what changed, and re-plan the
        fleet when the nodes serving the version changed (``replan``)."""
        self._note_stall(r, before, verdict, now)
        r.reason = verdict.reason
        if verdict.decision == "roll_back":
            return self.transition(r, "rolled_back", verdict.reason, "rollout_rolled_back")
        if verdict.decision == "complete":
            return self.transition(r, "complete", verdict.reason, "rollout_completed")
        if r != before:
            r.updated_at = now
            self._book.save(r)
        if replan:
            self._on_change()
        return r

    def _evaluate_staged(self, r: Rollout, before: Rollout, now: float) -> Rollout:
        """A staged rollout: progress, then flip, admit late nodes, complete or roll back."""
        flip.refresh(r, self._fleet.reported, before, now)
        verdict = flip.decide(r, now, self.flip_rules)
        if verdict.decision == "flip":
            r.state = "flipping"
            flip.admit(r, self._fleet.clock, self.flip_rules, now)
            reason = (
                f"flipping {len(r.switch_at)} of {len(r.targets)} nodes at {utc(r.flip_instant or now).isoformat()}"
            )
            return self.transition(r, "flipping", reason, "rollout_flipping")
        admitted = r.state == "flipping" and flip.admit(r, self._fleet.clock, self.flip_rules, now)
        if r.state == "flipping" and verdict.decision == "wait":
            verdict = flip.decide(r, now, self.flip_rules)  # the admissions change the words
        return self._conclude(r, before, verdict, now, admitted)

    def _evaluate_scheduled(
        self, r: Rollout, before: Rollout, labels: dict[str, dict[str, str]], now: float
    ) -> Rollout:
        """A rollout by waves, rate and windows: progress, admissions, then the gate's verdict."""
        scheduled.refresh(r, before, self._fleet.reported, now)
        r.healthy_since = scheduled.healthy_since(r, now)
        verdict = scheduled.decide(r, now, labels)
        admitted = scheduled.admit(r, labels, now) if verdict.decision != "roll_back" else []
        if admitted:
            log.info("rollout %d of %s: %s switch to version %s", r.id, r.model, ", ".join(admitted), r.version)
            r.healthy_since = scheduled.healthy_since(r, now)
            verdict = scheduled.decide(r, now, labels)
        if verdict.decision == "promote":
            return self.next_wave(r, "after a healthy soak")
        return self._conclude(r, before, verdict, now, bool(admitted))

    def next_wave(self, r: Rollout, why: str, actor: str | None = None) -> Rollout:
        """Open the next wave of a scheduled rollout (``rolling`` from the second wave on)."""
        r = r.model_copy(update={"wave": r.wave + 1, "healthy_since": None})
        reason = f"wave {r.wave + 1} of {len(r.wave_sizes)} {why}"
        r = self.transition(r, "rolling", reason, "rollout_promoted", actor)
        return self.evaluate(r, time.time())

    def retry(self, r: Rollout, nodes: list[str] | None, actor: str | None = None) -> list[str]:
        """Count ``nodes`` (None: every failed one) again and send every node a new desired
        state, on which edges retry what failed; returns the nodes retried."""
        r = r.model_copy(deep=True)
        chosen = retry(r, nodes, time.time())
        if chosen:
            self._book.save(r)
            self._emit(rollout_event("rollout_retried", r, f"retrying {', '.join(chosen)}", actor))
            self._on_change()
        return chosen

    def flip(self, r: Rollout, at: float, actor: str | None = None) -> Rollout:
        """Set (or move) the instant ``r``'s staged nodes switch at; sent ahead by the next pass."""
        r = r.model_copy(deep=True)
        r.flip_at = utc(at)
        if r.state == "flipping":
            r.switch_at = dict.fromkeys(r.switch_at, at)  # they still switch together
            self._book.save(r)
            self._on_change()
        else:
            self._book.save(r)
        self._emit(rollout_event("rollout_flip_set", r, f"flip at {utc(at).isoformat()}", actor))
        return self.evaluate(r, time.time())

    def _pick_canaries(self, r: Rollout, now: float) -> bool:
        """Choose canaries once there are targets; again only when every chosen one is gone.

        The canaries are stored with the rollout, so a restarted central keeps them. A canary
        not seen since this central started may still be reconnecting: it keeps its role for
        ``canary_return_s`` after the start, while one seen and then gone is replaced at once."""
        self._seen.update(r.targets)
        if r.state != "canary" or set(r.canary_nodes) & set(r.targets):
            return False
        if r.canary_nodes and self._may_return(r.canary_nodes, now):
            return False
        chosen = choose_canaries(r, r.targets)
        changed = chosen != r.canary_nodes
        if changed and r.canary_nodes:
            log.warning("rollout %d of %s: canaries %s gone, now %s", r.id, r.model, r.canary_nodes, chosen)
        r.canary_nodes = chosen
        return changed

    def _may_return(self, canaries: list[str], now: float) -> bool:
        """Whether a canary has not been seen since the start and the grace to return lasts."""
        return now - self._started_at < self.canary_return_s and any(n not in self._seen for n in canaries)

    def _refresh_nodes(self, r: Rollout, before: Rollout, now: float) -> dict[str, str]:
        """Per-node progress (a failure sticks), counts and rate; returns node → error."""
        errors: dict[str, str] = {}
        nodes = {}
        failures = {}
        for node_id in r.targets:
            in_wave = r.state == "rolling" or node_id in r.canary_nodes
            reported = self._fleet.reported(node_id)
            progress, failure = settle(r, before, node_id, node_progress(r, in_wave, reported), reported, now)
            if failure is not None:
                failures[node_id] = failure
                errors[node_id] = failure.error or failure.reason
            nodes[node_id] = progress
        r.nodes, r.failures = nodes, failures
        tally(r)
        return errors

    @staticmethod
    def _healthy_since(r: Rollout, now: float) -> float | None:
        """The soak clock: set when every canary first reports ready, reset when one stops."""
        healthy = (
            r.state == "canary" and bool(r.canary_nodes) and all(r.nodes.get(n) == "ready" for n in r.canary_nodes)
        )
        return (r.healthy_since or now) if healthy else None

    def _note_stall(self, r: Rollout, before: Rollout, verdict: NextStep, now: float) -> None:
        """Send ``rollout_stuck`` once per stall of ``stuck_after_s`` with no node progress."""
        if r.nodes != before.nodes or r.state != before.state:
            r.progressed_at, r.stuck_reported = now, False
            return
        if not verdict.blocked:
            return
        if not r.stuck_reported and now - r.progressed_at >= self.stuck_after_s:
            r.stuck_reported = True
            log.warning("rollout %d of %s stuck: %s", r.id, r.model, verdict.reason)
            self._emit(rollout_event("rollout_stuck", r, verdict.reason))

    def transition(
        self, r: Rollout, state: RolloutState, reason: str | None, event: str, actor: str | None = None
    ) -> Rollout:
        """Move ``r`` to ``state``, persist it, send ``event`` and re-plan the fleet. ``actor``:
        the operator who asked (None for the controller's own decisions)."""
        r = r.model_copy(update={"state": state, "reason": reason, "updated_at": time.time()})
        if state != "canary":
            r.healthy_since = None
        self._book.save(r)
        log.info("rollout %d of %s:%s is %s (%s)", r.id, r.model, r.version, state, reason or "-")
        self._emit(rollout_event(event, r, reason, actor))
        self._on_change()
        return r


def rollout_event(event_type: str, r: Rollout, reason: str | None = None, actor: str | None = None) -> Event:
    """A rollout event for central's event log and the MQTT events topic."""
    detail: dict[str, object] = {"model": r.model, "version": r.version, "rollout_id": r.id}
    if reason:
        detail["reason"] = reason
    return Event(type=event_type, ts=int(time.time() * 1000), detail=detail, actor=actor)
