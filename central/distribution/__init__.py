"""Desired state: which versions each node holds and serves, and the chunks it seeds."""

from __future__ import annotations

from central.distribution.assignment import VersionAssignment
from central.distribution.desired_state import DesiredState, DesiredStateService
from central.distribution.verdicts import ArtifactVerdict, VerdictBook

__all__ = ["ArtifactVerdict", "DesiredState", "DesiredStateService", "VerdictBook", "VersionAssignment"]
