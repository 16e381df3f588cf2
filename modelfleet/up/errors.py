"""The one error type of ``modelfleet up``: whatever went wrong, as one line a person
can act on (which step, what the child said, where its log is)."""

from __future__ import annotations

__all__ = ["UpError"]


class UpError(RuntimeError):
    """A step of ``modelfleet up`` failed; the message is the line printed."""
