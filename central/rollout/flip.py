"""Staged rollouts, decided: every selected node downloads and verifies the version first
(``staging``), then they switch together at one instant of central's clock (``flipping``).

Central sends the flip ahead of the instant (``lead_s`` before it), so each node loads the
version beside the one it serves and switches at the instant on its own clock, corrected by the
offset it measured against central's (``edge_node.sync.clock``). A node whose offset is unknown,
larger than ``max_offset_s`` or less certain than ``max_error_s`` is refused the flip (progress
``refused``, reason ``clock``): it would switch at the wrong time. It keeps the version staged and
is admitted once its clock is known and good. A node that stages only after the instant (it was
down) switches as soon as it has staged: late, but never on a version it has not verified.

Pure functions over plain values, like ``progress``: the controller applies them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from central.rollout.labels import describe_selector
from central.rollout.model import NodeFailure, NodeProgress, Rollout, utc
from central.rollout.progress import NextStep, failure_reason, settle, tally
from fleetwire.mqtt.payloads import ModelInfo

#: node id → ``(offset_ms, error_ms)`` of central's clock against the node's; None: unknown.
Clocks = Callable[[str], "tuple[float, float] | None"]


@dataclass(frozen=True)
class FlipRules:
    """How far ahead a flip is sent, and which clocks may take part in it."""

    lead_s: float = 5.0
    max_offset_s: float = 2.0
    max_error_s: float = 0.1


def staged_progress(r: Rollout, node_id: str, reported: Sequence[ModelInfo] | None) -> NodeProgress:
    """One node's progress on a staged rollout's version, from its last heartbeat."""
    info = next((m for m in reported or () if m.name == r.model and m.version == r.version), None)
    if info is None:
        return "loading"
    if info.state in ("failed", "error") or (info.errors > 0 and info.state != "retired"):
        return "failed"
    if info.state == "ready":
        return "ready"
    return "staged" if info.state == "staged" else "loading"


def clock_refusal(clock: tuple[float, float] | None, rules: FlipRules) -> NodeFailure | None:
    """Why a node's clock keeps it out of a flip, or None when it may take part."""
    if clock is None:
        return NodeFailure(reason="clock", error="clock offset unknown (no measurement from this node yet)")
    offset_ms, error_ms = clock
    if abs(offset_ms) > rules.max_offset_s * 1000:
        return NodeFailure(
            reason="clock", error=f"clock {offset_ms / 1000:+.3f} s from central's (more than {rules.max_offset_s} s)"
        )
    if error_ms > rules.max_error_s * 1000:
        return NodeFailure(
            reason="clock",
            error=f"clock offset known only to ± {error_ms / 1000:.3f} s (more than {rules.max_error_s} s)",
        )
    return None


def admit(r: Rollout, clocks: Clocks, rules: FlipRules, now: float) -> bool:
    """In ``flipping``: give every staged node whose clock is good its instant (the flip's, or
    now for one that staged late); mark the others ``refused``. True when a node was admitted."""
    flip_at = r.flip_instant
    assert flip_at is not None, "a flipping rollout has an instant"
    admitted = False
    for node_id in r.targets:
        if node_id in r.switch_at or r.nodes.get(node_id) not in ("staged", "ready", "refused"):
            continue
        refusal = clock_refusal(clocks(node_id), rules)
        if refusal is not None:
            r.nodes[node_id] = "refused"
            r.failures[node_id] = refusal
            continue
        r.switch_at[node_id] = max(flip_at, now)
        r.failures.pop(node_id, None)
        admitted = True
    return admitted


def refresh(r: Rollout, reports: Callable[[str], Sequence[ModelInfo] | None], before: Rollout, now: float) -> None:
    """Per-node progress, counts and failure rate of a staged rollout (a failure sticks, except
    ``network``: the edge keeps retrying)."""
    nodes: dict[str, NodeProgress] = {}
    failures: dict[str, NodeFailure] = {}
    for node_id in sorted(set(before.nodes) - set(r.targets)):
        nodes[node_id] = "offline"  # a target that left: reported until it is back, never waited for
    for node_id in r.targets:
        reported = reports(node_id)
        progress, failure = settle(r, before, node_id, staged_progress(r, node_id, reported), reported, now)
        if failure is not None:
            failures[node_id] = failure
        nodes[node_id] = progress
    r.nodes, r.failures = nodes, failures
    # An admitted node that leaves keeps its instant: back, it serves the version it switched to.
    tally(r, staged_count=True)


def decide(r: Rollout, now: float, rules: FlipRules) -> NextStep:
    """The next step of a staged rollout whose progress is up to date: ``flip`` (send it),
    ``complete``, ``roll_back`` or ``wait``."""
    reported = r.ready + r.failed + r.staged
    if reported >= r.min_nodes and r.failure_rate > r.failure_threshold:
        errors = {n: f.error or f.reason for n, f in r.failures.items() if r.nodes.get(n) == "failed"}
        return NextStep("roll_back", failure_reason(r, errors))
    if not r.targets:
        return NextStep("wait", f"no node matches selector {describe_selector(r.selector)}", blocked=True)
    flip_at = r.flip_instant
    holding = r.staged + r.ready
    offline = [n for n, p in r.nodes.items() if p == "offline"]
    gone = f"; offline: {_names(offline)} (switches once back and staged)" if offline else ""
    if r.state == "staging":
        if flip_at is not None and now >= flip_at - rules.lead_s:
            return NextStep("flip", None)
        counted = f"staged on {holding} of {len(r.targets)} nodes"
        behind = [n for n in r.targets if r.nodes.get(n) not in ("staged", "ready")]
        waiting = f"; waiting for {_listed(behind)}" if behind else ""
        if flip_at is None:
            return NextStep(
                "wait", f"{counted}{waiting}{gone}; flip with `modelfleet flip {r.model}`", blocked=bool(behind)
            )
        return NextStep(
            "wait", f"{counted}{waiting}{gone}; flipping at {utc(flip_at).isoformat()}", blocked=bool(behind)
        )
    behind = [n for n in r.targets if r.nodes.get(n) != "ready"]
    if not behind:
        return NextStep("complete", f"every node on version {r.version}{gone}" if offline else None)
    assert flip_at is not None
    when = utc(flip_at).isoformat()
    if now < flip_at:
        return NextStep("wait", f"flipping {len(r.switch_at)} of {len(r.targets)} nodes at {when}{gone}")
    detail = ", ".join(f"{n} ({r.nodes.get(n, 'pending')})" for n in behind[:5]) + (", …" if len(behind) > 5 else "")
    return NextStep("wait", f"flipped at {when}; {len(behind)} not on it yet: {detail}{gone}", blocked=True)


def _names(nodes: list[str]) -> str:
    return ", ".join(nodes[:5]) + (", …" if len(nodes) > 5 else "")


def _listed(nodes: list[str]) -> str:
    return f"{len(nodes)} {'node' if len(nodes) == 1 else 'nodes'} to stage: {_names(nodes)}"
