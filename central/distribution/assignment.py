"""One version in a node's desired state: what ``desired_state`` computes and ``grants``
records as sent (its own module, so that neither has to import the other for it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from central.distribution.verdicts import ArtifactVerdict
from fleetwire.manifest import Manifest


@dataclass(frozen=True)
class VersionAssignment:
    """One version a node must hold, with the owners of each of its chunks."""

    manifest: Manifest
    serve: bool
    placement: dict[str, list[str]]
    #: Which artifact to serve, as a node of this node's hardware class timed it; None: time them.
    verdict: ArtifactVerdict | None = None
    #: Held whole but not served (a staged rollout before its flip).
    stage: bool = False
    #: Served from this instant of central's clock (Unix seconds); None: at once.
    serve_at: float | None = None
    #: Served as this artifact whatever else says (central's INT8 → FP32 fallback); None: no override.
    force_artifact: str | None = None


@dataclass(frozen=True)
class NodeHolding:
    """Per node, what its desired state adds to the versions it serves."""

    #: ``(name, version)`` held whole without serving.
    staged: frozenset[tuple[str, str]] = frozenset()
    #: Served version → the instant it switches (central's clock, Unix seconds).
    serve_at: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Version → the artifact it must be served as.
    force_artifact: dict[tuple[str, str], str] = field(default_factory=dict)
