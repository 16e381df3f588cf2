"""What a node serves of a version's artifacts and why (``ArtifactChoice``), and the rule
that picks it from timings (``pick``): the fastest artifact, never one slower than FP32.
The timings come from ``artifact_timer`` (tensor models) or ``decode_timer`` (language
models); both give seconds per run at batch 1 and batch 8, so one rule serves both."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleetwire.mqtt.payloads import MAX_CHOICE_REASON, ArtifactChoiceInfo

__all__ = ["FP32", "PIN_LABEL", "ArtifactChoice", "ChoiceSource", "Timing", "pick"]

#: The manifest label an operator pins an artifact with (``--label modelfleet.artifact=fp32``):
#: every node serves it, timed or not, even when slower than FP32. Signed with the manifest.
PIN_LABEL = "modelfleet.artifact"
FP32 = "fp32"

#: Where a served artifact's choice came from.
ChoiceSource = Literal["measured", "verdict", "pinned", "only", "default", "central"]


@dataclass(frozen=True)
class ArtifactChoice:
    """Which artifact a node serves for one version, and why."""

    artifact: str
    hardware_class: str
    source: ChoiceSource
    reason: str
    speedup_b1: float | None = None
    """FP32's time over the chosen artifact's at batch 1 (None: not timed)."""
    speedup_b8: float | None = None
    """The same at batch 8 (None: not timed, or the model's batch axis is fixed)."""
    from_node: str | None = None
    """The node whose timing this is (a verdict shared through central: another node)."""

    def info(self) -> ArtifactChoiceInfo:
        """The heartbeat's form (the reason cut to the payload's limit)."""
        return ArtifactChoiceInfo(**{**self.as_json(), "reason": self.reason[:MAX_CHOICE_REASON]})

    def as_json(self) -> dict[str, Any]:
        """The form kept on disk and sent in heartbeats."""
        return {k: v for k, v in vars(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArtifactChoice:
        """The inverse of ``as_json``; ``KeyError``/``TypeError`` on a malformed record."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Timing:
    """Median seconds per run of one artifact at batch 1 and batch 8 (None: not timed)."""

    artifact: str
    b1_s: float
    b8_s: float | None


def _speedup(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or other <= 0:
        return None
    return round(base / other, 3)


def pick(timings: Mapping[str, Timing], hardware_class: str, node_id: str, min_speedup: float) -> ArtifactChoice:
    """The fastest artifact of ``timings``, never one slower than FP32 (which must be timed).

    An INT8 artifact qualifies when it is at least ``min_speedup`` times as fast as FP32 at
    every batch size timed; among those (and FP32, at 1.0) the best geometric mean of the
    speed-ups wins."""
    base = timings[FP32]
    speedups = {a: (_speedup(base.b1_s, t.b1_s), _speedup(base.b8_s, t.b8_s)) for a, t in timings.items()}

    def score(artifact: str) -> float:
        found = [s for s in speedups[artifact] if s is not None]
        return math.prod(found) ** (1 / len(found)) if found else 0.0

    qualified = [a for a, s in speedups.items() if a == FP32 or all(x >= min_speedup for x in s if x is not None)]
    best = max(qualified, key=lambda a: (score(a), a == FP32))
    b1, b8 = speedups[best]
    return ArtifactChoice(
        artifact=best,
        hardware_class=hardware_class,
        source="measured",
        reason=f"fastest of {len(timings)} on this node",
        speedup_b1=b1,
        speedup_b8=b8,
        from_node=node_id,
    )
