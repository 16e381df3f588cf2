"""Scheduled rollouts, decided: waves of a set size, a rate, maintenance windows, an abort rule.

The targets are ranked once per version (``waves.order_targets``, the canary order), and wave
``k`` admits the first ``wave_sizes[k]`` of them. A node is *admitted* (it switches, at once)
when its wave has begun, a maintenance window selecting it is open (or none selects it), and
the rate (``rate_per_min``) has room. Admission is for good: a window that closes does not send
a switched node back; a rollback does, for every switched node at once. With windows, every
target not admitted yet downloads the version meanwhile (``stages``), so a window is spent
switching, not fetching.

Between waves the gate is the canary's: every node of the wave ready, then ``soak_s`` healthy
seconds (None: an operator's promote). The abort rule is the failure rate of the admitted nodes
that reported, past ``min_nodes``. Pure functions over plain values, like ``progress``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from central.rollout.labels import describe_selector, matches
from central.rollout.model import NodeFailure, NodeProgress, Rollout
from central.rollout.progress import NextStep, failure_reason, node_progress, settle, tally
from central.rollout.waves import admit as rate_admit
from central.rollout.waves import canary_waves, next_admission_at, order_targets, wave_sizes
from central.rollout.windows import describe_window, may_switch
from fleetwire.mqtt.payloads import ModelInfo


def specs(r: Rollout) -> list[str]:
    """The rollout's waves: as asked, else the canary fraction then everyone."""
    return [str(w) for w in r.waves] if r.waves is not None else canary_waves(r.canary)


def refresh(r: Rollout, before: Rollout, reports: Callable[[str], Sequence[ModelInfo] | None], now: float) -> None:
    """Per-node progress (admitted nodes from their heartbeats; the others ``pending`` or
    ``staged``), the wave sizes over today's targets, counts and the failure rate."""
    r.wave_sizes = wave_sizes(specs(r), len(r.targets))
    nodes: dict[str, NodeProgress] = {}
    failures: dict[str, NodeFailure] = {}
    for node_id in r.targets:
        reported = reports(node_id)
        if node_id not in r.switch_at:
            nodes[node_id] = "staged" if _reports_state(r, reported, "staged") else "pending"
            continue
        progress, failure = settle(r, before, node_id, node_progress(r, True, reported), reported, now)
        if failure is not None:
            failures[node_id] = failure
        nodes[node_id] = progress
    r.nodes, r.failures = nodes, failures
    tally(r)


def _reports_state(r: Rollout, reported: Sequence[ModelInfo] | None, state: str) -> bool:
    return any(m.name == r.model and m.version == r.version and m.state == state for m in reported or ())


def wave_members(r: Rollout) -> list[str]:
    """The targets the current wave covers, in rank order."""
    if not r.wave_sizes:
        return []
    ranked = order_targets(r.model, r.version, r.targets)
    return ranked[: r.wave_sizes[min(r.wave, len(r.wave_sizes) - 1)]]


def admit(r: Rollout, labels: dict[str, dict[str, str]], now: float) -> list[str]:
    """Let in the current wave's nodes whose window is open, as fast as the rate allows;
    returns the nodes admitted now."""
    waiting = [n for n in wave_members(r) if n not in r.switch_at and r.nodes.get(n) != "failed"]
    allowed = [n for n in waiting if may_switch(r.windows, labels.get(n, {}), now)]
    chosen = rate_admit(allowed, r.switch_at, r.rate_per_min, now)
    for node_id in chosen:
        r.switch_at[node_id] = now
        r.nodes[node_id] = "loading"
    return chosen


def decide(r: Rollout, now: float, labels: dict[str, dict[str, str]]) -> NextStep:
    """The next step: roll back, complete, promote (next wave), or wait, with the reason."""
    reported = r.ready + r.failed
    if reported >= r.min_nodes and r.failure_rate > r.failure_threshold:
        errors = {n: f.error or f.reason for n, f in r.failures.items()}
        return NextStep("roll_back", failure_reason(r, errors))
    if not r.targets:
        return NextStep("wait", f"no node matches selector {describe_selector(r.selector)}", blocked=True)
    last = r.wave >= len(r.wave_sizes) - 1
    members = wave_members(r)
    header = f"wave {r.wave + 1} of {len(r.wave_sizes)} ({len(members)} of {len(r.targets)} nodes)"
    outside = [n for n in members if n not in r.switch_at]
    if outside:
        return NextStep("wait", f"{header}: {_why_waiting(r, outside, labels, now)}", blocked=False)
    behind = [n for n in members if r.nodes.get(n) != "ready"]
    if behind:
        shown = ", ".join(behind[:5]) + (", …" if len(behind) > 5 else "")
        return NextStep("wait", f"{header}: waiting for {len(behind)} to load version {r.version}: {shown}", True)
    if last:
        return NextStep("complete", None)
    if r.soak_s is None:
        return NextStep("wait", f"{header} healthy; waiting for a manual promote to the next wave")
    left = r.soak_s - (now - (r.healthy_since or now))
    if left <= 0:
        return NextStep("promote", None)
    return NextStep("wait", f"{header} healthy; next wave in {left:.0f} s")


def _why_waiting(r: Rollout, outside: list[str], labels: dict[str, dict[str, str]], now: float) -> str:
    closed = [n for n in outside if not may_switch(r.windows, labels.get(n, {}), now)]
    parts = []
    if closed:
        windows = "; ".join(
            describe_window(w, now) for w in r.windows if any(matches(w.selector, labels.get(n, {})) for n in closed)
        )
        parts.append(f"{len(closed)} outside their maintenance window ({windows}); staged meanwhile")
    rated = len(outside) - len(closed)
    if rated and r.rate_per_min is not None:
        at = next_admission_at(r.switch_at, r.rate_per_min, now)
        parts.append(f"{rated} waiting for the rate of {r.rate_per_min:g}/min (next in {max(0.0, at - now):.0f} s)")
    elif rated:
        parts.append(f"{rated} switching now")
    return "; ".join(parts) or f"{len(outside)} to switch"


def healthy_since(r: Rollout, now: float) -> float | None:
    """The gate's soak clock: set when the whole current wave is ready, reset when one is not."""
    members = wave_members(r)
    healthy = bool(members) and all(r.nodes.get(n) == "ready" for n in members)
    return (r.healthy_since or now) if healthy else None
