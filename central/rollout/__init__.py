"""Staged rollouts: canary waves by label selector, soak and promote, and automatic
rollback past a failure threshold, persisted beside the registry; and the cost preview of
one (a dry run)."""

from __future__ import annotations

from central.rollout.book import RolloutBook
from central.rollout.controller import RolloutController
from central.rollout.cost import RolloutPreview
from central.rollout.fleet import DirectoryFleet, FleetView
from central.rollout.model import Rollout, RolloutRequest
from central.rollout.plan import ServingPlan
from central.rollout.previewer import RolloutPreviewer
from central.rollout.service import RolloutService

__all__ = [
    "DirectoryFleet",
    "FleetView",
    "Rollout",
    "RolloutBook",
    "RolloutController",
    "RolloutPreview",
    "RolloutPreviewer",
    "RolloutRequest",
    "RolloutService",
    "ServingPlan",
]
