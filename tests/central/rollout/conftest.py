"""Fixtures of the rollout unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollout_harness import RolloutHarness


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[RolloutHarness]:
    """A harness with model ``m`` at version 1 (stable) and 2 (stored, not activated)."""
    h = RolloutHarness(tmp_path)
    h.store_version("m", "1")
    h.store_version("m", "2", activate=False)
    yield h
    h.close()
