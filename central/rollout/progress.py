"""One evaluation of a rollout against what the fleet reports: per-node progress, the
failure rate, and the decision (wait, promote, complete, roll back) with its reason.

Pure functions over plain values, so the controller's rules are testable without a
fleet and read in one place."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from central.rollout.labels import describe_selector
from central.rollout.model import NodeFailure, NodeProgress, Rollout
from fleetwire.mqtt.payloads import ModelInfo

Decision = Literal["wait", "promote", "complete", "roll_back", "flip"]


@dataclass(frozen=True)
class NextStep:
    """What the controller should do next, and why (in words, for ``reason``)."""

    decision: Decision
    reason: str | None
    #: True while nodes hold the rollout up (no node matches, or nodes have not loaded).
    blocked: bool = False


def choose_canaries(rollout: Rollout, targets: Sequence[str]) -> list[str]:
    """``ceil(canary × targets)`` nodes (at least one), picked by a hash of the model,
    version and node id: stable across restarts, different across versions."""
    if not targets:
        return []
    count = max(1, math.ceil(rollout.canary * len(targets) - 1e-9))

    def rank(node_id: str) -> str:
        return hashlib.sha256(f"{rollout.model}:{rollout.version}:{node_id}".encode()).hexdigest()

    return sorted(sorted(targets, key=rank)[:count])


def node_progress(rollout: Rollout, in_wave: bool, reported: Sequence[ModelInfo] | None) -> NodeProgress:
    """One node's progress on the rollout's version, from its last heartbeat."""
    if not in_wave:
        return "pending"
    info = next((m for m in reported or () if m.name == rollout.model and m.version == rollout.version), None)
    if info is None:
        return "loading"
    if info.state in ("failed", "error") or (info.errors > 0 and info.state != "retired"):
        return "failed"
    return "ready" if info.state == "ready" else "loading"


#: Failures that pass: the edge keeps retrying and its node counts again once it recovers.
TRANSIENT_REASONS: frozenset[str] = frozenset({"network"})


#: After an operator's retry, a node's stale ``failed`` report is ignored this long (its edge
#: retries on the next desired state and reports again within a heartbeat or two).
RETRY_GRACE_S = 5.0


def settle(
    r: Rollout, before: Rollout, node_id: str, progress: NodeProgress, reported: Sequence[ModelInfo] | None, now: float
) -> tuple[NodeProgress, NodeFailure | None]:
    """A node's progress once the rules of failure apply: a failure sticks for the rollout,
    except a transient one (``network``: the edge keeps retrying) and one an operator retried
    (its stale report is ignored for ``RETRY_GRACE_S``). Returns the progress and, when failed, why."""
    retried = now - r.retried_at.get(node_id, float("-inf")) < RETRY_GRACE_S
    if progress == "failed" and retried:
        progress = "loading"
    failure = node_failure(r, reported) if progress == "failed" else before.failures.get(node_id)
    transient = failure is not None and failure.reason in TRANSIENT_REASONS
    if before.nodes.get(node_id) == "failed" and not transient and not retried:
        progress = "failed"
    if progress != "failed":
        return progress, None
    return progress, failure or NodeFailure(reason="unknown")


def node_failure(rollout: Rollout, reported: Sequence[ModelInfo] | None) -> NodeFailure:
    """Why a failed node failed, from its last heartbeat's entry for the rollout's version."""
    info = next((m for m in reported or () if m.name == rollout.model and m.version == rollout.version), None)
    if info is None or (info.state not in ("failed", "error") and info.errors > 0):
        return NodeFailure(reason="inference", error="inference errors reported")
    return NodeFailure(reason=info.reason or "unknown", error=info.error)


def failure_reason(rollout: Rollout, errors: dict[str, str]) -> str:
    """Why a rollout is rolled back: the rate, the threshold and the first node's error."""
    reported = rollout.ready + rollout.failed
    first = next(iter(sorted(errors.items())), None)
    detail = f"; {first[0]}: {first[1]}" if first else ""
    return (
        f"{rollout.failed} of {reported} nodes failed on version {rollout.version}"
        f" ({rollout.failure_rate:.0%} > threshold {rollout.failure_threshold:.0%}){detail}"
    )


def _waiting(nodes: list[str], what: str, version: str) -> str:
    shown = ", ".join(nodes[:5]) + (", …" if len(nodes) > 5 else "")
    plural = "node" if len(nodes) == 1 else "nodes"
    return f"waiting for {len(nodes)} {what}{plural} to load version {version}: {shown}"


def decide(rollout: Rollout, now: float, errors: dict[str, str]) -> NextStep:
    """The next step for an in-progress rollout whose progress fields are up to date."""
    reported = rollout.ready + rollout.failed
    if reported >= rollout.min_nodes and rollout.failure_rate > rollout.failure_threshold:
        return NextStep("roll_back", failure_reason(rollout, errors))
    if not rollout.targets:
        return NextStep("wait", f"no node matches selector {describe_selector(rollout.selector)}", blocked=True)
    wave = rollout.canary_nodes if rollout.state == "canary" else rollout.targets
    behind = [n for n in wave if rollout.nodes.get(n) != "ready"]
    if behind:
        return NextStep("wait", _waiting(behind, "canary " if rollout.state == "canary" else "", rollout.version), True)
    if rollout.state == "rolling":
        return NextStep("complete", None)
    healthy = f"canary healthy on {len(wave)} {'node' if len(wave) == 1 else 'nodes'}"
    if rollout.soak_s is None:
        return NextStep("wait", f"{healthy}; waiting for a manual promote")
    left = rollout.soak_s - (now - (rollout.healthy_since or now))
    if left <= 0:
        return NextStep("promote", None)
    return NextStep("wait", f"{healthy}; promoting in {left:.0f} s")


def retry(r: Rollout, nodes: Sequence[str] | None, now: float) -> list[str]:
    """Clear the failures of ``nodes`` (None: every failed node) so they count again; returns
    those retried. Their stale reports are ignored for ``RETRY_GRACE_S`` (``settle``)."""
    chosen = [n for n in (nodes if nodes is not None else sorted(r.failures)) if r.nodes.get(n) == "failed"]
    for node_id in chosen:
        r.retried_at[node_id] = now
        r.nodes[node_id] = "loading"
        r.failures.pop(node_id, None)
    tally(r, staged_count=r.stage)
    return chosen


def tally(r: Rollout, *, staged_count: bool = False) -> None:
    """``ready``, ``failed``, ``staged`` and the failure rate from ``r.nodes``; ``staged_count``:
    a staged node has reported on the version too (a staged rollout, where it is a success so far)."""
    counts = {p: 0 for p in ("ready", "failed", "staged")}
    for p in r.nodes.values():
        if p in counts:
            counts[p] += 1
    r.ready, r.failed, r.staged = counts["ready"], counts["failed"], counts["staged"]
    reported = r.ready + r.failed + (r.staged if staged_count else 0)
    r.failure_rate = r.failed / reported if reported else 0.0
