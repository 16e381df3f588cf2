"""Settings of the rollout controller (central's ``rollout`` section)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RolloutSettings(BaseModel):
    """How often rollouts are evaluated and when a stalled one is reported stuck."""

    interval_s: float = Field(0.5, gt=0, le=60, description="Seconds between evaluations of in-progress rollouts.")
    stuck_after_s: float = Field(
        60.0, gt=0, description="A rollout whose nodes make no progress this long gets a rollout_stuck event."
    )
