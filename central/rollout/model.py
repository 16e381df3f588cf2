"""The rollout record as central stores it and the REST API returns it.

One pydantic model is both the SQLite row (as JSON) and the API body, so what an
operator sees after a central restart is exactly what was persisted."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from central.rollout.labels import matches
from central.rollout.waves import WaveSpec, normalize_waves
from central.rollout.windows import MaintenanceWindow

RolloutState = Literal["staging", "flipping", "canary", "rolling", "complete", "rolled_back"]
NodeProgress = Literal["pending", "loading", "staged", "ready", "failed", "refused", "offline"]

#: States in which the controller still moves a rollout on.
IN_PROGRESS: frozenset[str] = frozenset({"staging", "flipping", "canary", "rolling"})
#: States in which a rollout decides what its nodes hold or serve.
IN_EFFECT: frozenset[str] = frozenset({"staging", "flipping", "canary", "rolling", "complete"})
_PRIVATE = {"healthy_since", "progressed_at", "stuck_reported"}


class NodeFailure(BaseModel):
    """Why a node failed on a rollout's version, as its heartbeat said."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    reason: str
    """A short code: signature, disk, cache_too_small, network, assembly, load, or inference
    (failed requests); ``unknown`` from an edge that names none."""
    error: str | None = None
    """The edge's message."""


class RolloutRequest(BaseModel):
    """The body of ``POST /api/v1/models/{name}/rollouts``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    version: str = Field(min_length=1)
    """The stored version to roll out (pushed with ``activate=false`` or earlier)."""
    canary: float = Field(0.1, gt=0, le=1)
    """Fraction of the selected nodes that get the version first (at least one node)."""
    selector: dict[str, str] = Field(default_factory=dict)
    """Label equality match on the nodes' announced labels; empty selects every node."""
    soak_s: float | None = Field(None, ge=0)
    """None: wait for a manual promote; a number: promote that long after every canary is healthy."""
    failure_threshold: float = Field(0.25, ge=0, le=1)
    """Abort and roll back when the failed fraction of reporting nodes exceeds this."""
    min_nodes: int = Field(1, ge=1)
    """Reports on the new version needed before the failure rate counts."""
    stage: bool = False
    """Download first: every selected node fetches, verifies and holds the version without
    serving it; they switch together at a flip (``flip_at`` or a later ``flip``)."""
    flip_at: AwareDatetime | None = None
    """When staged nodes switch, on central's clock (ISO 8601 with a zone, e.g.
    2026-12-04T02:00:00Z); implies ``stage``. None with ``stage``: wait for a ``flip``."""
    waves: list[WaveSpec] | None = Field(None, min_length=1)
    """Cumulative wave sizes, node counts or percentages of the targets: ``["1", "10%", "100%"]``
    (``100%`` is added when missing). None: the canary fraction, then everyone."""
    rate_per_min: float | None = Field(None, gt=0)
    """At most this many nodes switch per minute (a sliding minute); None: a wave at once."""
    windows: list[MaintenanceWindow] = Field(default_factory=list)
    """Maintenance windows: a node one of them selects switches only while one of its windows is
    open (it downloads the version meanwhile); nodes no window selects switch any time."""

    @field_validator("version")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()

    @field_validator("waves", mode="before")
    @classmethod
    def _waves(cls, value: object) -> object:
        # Before pydantic's coercion, so that true or 1.5 in the JSON body is refused, not read as 1.
        return list(normalize_waves(value)) if isinstance(value, list) and value else value

    @model_validator(mode="after")
    def _flip_implies_stage(self) -> RolloutRequest:
        if self.flip_at is not None:
            self.stage = True
        if self.stage and self.scheduled:
            raise ValueError(
                "stage switches every node at one flip; waves, rate_per_min and windows switch them in steps:"
                " use one or the other"
            )
        return self

    @property
    def scheduled(self) -> bool:
        """Whether nodes switch by waves, a rate or windows (not the plain canary → everyone)."""
        return self.waves is not None or self.rate_per_min is not None or bool(self.windows)


class Rollout(RolloutRequest):
    """A rollout with its progress; ``reason`` says in words why it waits or ended."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    id: int = 0
    model: str
    previous_version: str | None = None
    state: RolloutState = "canary"
    targets: list[str] = Field(default_factory=list)
    canary_nodes: list[str] = Field(default_factory=list)
    nodes: dict[str, NodeProgress] = Field(default_factory=dict)
    failures: dict[str, NodeFailure] = Field(default_factory=dict)
    """Node → why it failed, for every ``failed`` node, and why a flip was refused to every
    ``refused`` one (``clock``)."""
    switch_at: dict[str, float] = Field(default_factory=dict)
    """Staged rollouts: node → the instant (Unix seconds, central's clock) it switches; a node
    staged only after the flip switches at once."""
    ready: int = 0
    failed: int = 0
    staged: int = 0
    """Nodes holding the version, not serving it yet."""
    wave: int = 0
    """Scheduled rollouts: the wave under way (0 is the first)."""
    wave_sizes: list[int] = Field(default_factory=list)
    """Scheduled rollouts: cumulative nodes per wave, over today's targets."""
    retried_at: dict[str, float] = Field(default_factory=dict)
    """Node → when an operator last retried it (its failure cleared)."""
    failure_rate: float = 0.0
    reason: str | None = None
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    #: When every canary was first seen healthy (the soak clock); not part of the contract.
    healthy_since: float | None = None
    #: When the node progress last changed (for ``rollout_stuck``); not part of the contract.
    progressed_at: float = Field(default_factory=time.time)
    #: Whether a ``rollout_stuck`` event was sent for the current stall.
    stuck_reported: bool = False

    def public(self) -> dict[str, object]:
        """The contract's JSON form (the controller's bookkeeping left out)."""
        return self.model_dump(mode="json", exclude=_PRIVATE)

    @property
    def in_progress(self) -> bool:
        """Canary or rolling: the controller still acts on it."""
        return self.state in IN_PROGRESS

    def in_wave(self, node_id: str, labels: dict[str, str]) -> bool:
        """Whether ``node_id`` serves this rollout's version now (ignores rolled-back state)."""
        if not matches(self.selector, labels):
            return False
        if self.state == "staging":
            return False
        if self.state == "flipping" or (self.scheduled and self.state in ("canary", "rolling")):
            return node_id in self.switch_at
        return self.state != "canary" or node_id in self.canary_nodes

    def stages(self, node_id: str, labels: dict[str, str]) -> bool:
        """Whether ``node_id`` holds this rollout's version without serving it yet: every target
        of a staged rollout before its flip, and of one with maintenance windows before it switches."""
        if not (self.stage or self.windows) or not self.in_progress:
            return False
        return matches(self.selector, labels) and not self.in_wave(node_id, labels)

    def serve_at(self, node_id: str) -> float | None:
        """The instant ``node_id`` switches to this version (None: at once)."""
        return self.switch_at.get(node_id) if self.state == "flipping" else None

    @property
    def flip_instant(self) -> float | None:
        """``flip_at`` as Unix seconds."""
        return self.flip_at.timestamp() if self.flip_at is not None else None


def utc(ts: float) -> datetime:
    """Unix seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, UTC)
