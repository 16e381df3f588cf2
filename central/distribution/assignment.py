"""One version in a node's desired state: what ``desired_state`` computes and ``grants``
records as sent (its own module, so that neither has to import the other for it)."""

from __future__ import annotations

from dataclasses import dataclass

from central.distribution.verdicts import Verdict
from fleetwire.manifest import Manifest


@dataclass(frozen=True)
class VersionAssignment:
    """One version a node must hold, with the owners of each of its chunks."""

    manifest: Manifest
    serve: bool
    placement: dict[str, list[str]]
    #: Which artifact to serve, as a node of this node's hardware class timed it; None: time them.
    verdict: Verdict | None = None
