"""Desired state: which versions each node holds and serves, and the chunks it seeds."""

from __future__ import annotations

from central.distribution.desired_state import DesiredState, DesiredStateService, VersionAssignment

__all__ = ["DesiredState", "DesiredStateService", "VersionAssignment"]
