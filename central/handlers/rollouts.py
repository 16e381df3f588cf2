"""What operators do with rollouts and INT8 on live traffic: start (or preview), show,
promote, flip, retry and roll back a rollout; read and clear a version's agreement figures.
Each checks the names it is given and returns plain data."""

from __future__ import annotations

from typing import Any

from central.registry.service import check_name
from central.rollout import RolloutRequest, RolloutService
from central.rollout.drift import DriftWatch
from central.rollout.promotion import PromotionWatch


class RolloutHandlers:
    """Rollouts, flips and drift (agreement of INT8 with FP32)."""

    def __init__(self, rollouts: RolloutService, drift: DriftWatch, promotion: PromotionWatch | None = None) -> None:
        self._rollouts = rollouts
        self._drift = drift
        self._promotion = promotion

    def start(self, name: str, request: RolloutRequest, actor: str) -> dict[str, Any]:
        """Start a rollout of ``request.version``."""
        check_name("model name", name)
        check_name("version", request.version)
        return self._rollouts.start(name, request, actor).public()

    def preview(self, name: str, request: RolloutRequest) -> dict[str, Any]:
        """What a rollout would cost; nothing is written."""
        check_name("model name", name)
        check_name("version", request.version)
        return self._rollouts.preview(name, request).as_dict()

    def all(self) -> list[dict[str, Any]]:
        """Every rollout, oldest first."""
        return [r.public() for r in self._rollouts.all()]

    def current(self, name: str) -> dict[str, Any]:
        """The model's latest rollout."""
        check_name("model name", name)
        return self._rollouts.get(name).public()

    def promote(self, name: str, actor: str) -> dict[str, Any]:
        """Move the rollout to its next wave (or finish it)."""
        check_name("model name", name)
        return self._rollouts.promote(name, actor).public()

    def flip(self, name: str, at: float | None, actor: str) -> dict[str, Any]:
        """Switch a staged rollout's nodes together at ``at`` (or move the instant before it comes)."""
        check_name("model name", name)
        return self._rollouts.flip(name, at, actor).public()

    def retry(self, name: str, nodes: list[str] | None, actor: str) -> dict[str, Any]:
        """Count failed nodes again (all, or ``nodes``)."""
        check_name("model name", name)
        return self._rollouts.retry(name, nodes, actor).public()

    def rollback(self, name: str, actor: str) -> dict[str, Any]:
        """Roll the model's rollout back."""
        check_name("model name", name)
        return self._rollouts.rollback(name, actor=actor).public()

    def agreement(self, name: str, version: str) -> dict[str, Any]:
        """Live agreement of the version's INT8 with FP32, per node and pooled, and the fallbacks."""
        check_name("model name", name)
        check_name("version", version)
        report = self._drift.report(name, version)
        report["pending"] = self._promotion.report(name, version) if self._promotion is not None else {}
        return report

    def clear_agreement(self, name: str, version: str) -> dict[str, Any]:
        """Forget the version's flags and fallbacks: its nodes serve their own choice again."""
        check_name("model name", name)
        check_name("version", version)
        return {"model": name, "version": version, "cleared_nodes": self._drift.clear(name, version)}
