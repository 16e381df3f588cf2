"""How far each version this node holds is, and why one failed: what the status document
and the heartbeat report for it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REASONS", "VersionProgress"]

#: Why a version could not be made ready (``VersionProgress.reason``); ``load`` (ONNX Runtime
#: refused the files) is the inference repository's, added by the heartbeat.
REASONS = ("signature", "cache_too_small", "disk", "assembly", "network", "load")


@dataclass
class VersionProgress:
    """How far one version is."""

    name: str
    version: str
    state: str  # pending | fetching | staged | complete | failed
    chunks_total: int
    chunks_present: int = 0
    size: int = 0
    error: str | None = None
    #: Why it failed, one of ``REASONS`` (None unless ``state`` is failed).
    reason: str | None = None
    completed_at: float | None = None

    def fail(self, reason: str, error: str) -> None:
        """Mark the version failed for ``reason``, explained by ``error``."""
        self.state, self.reason, self.error = "failed", reason, error

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return dict(vars(self))
