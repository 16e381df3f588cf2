"""Models made by code, for tests, the demo and benchmarks (never from a hub)."""

from __future__ import annotations

from modelfleet.zoo.synthetic import build_mlp, mlp_bytes

__all__ = ["build_mlp", "mlp_bytes"]
