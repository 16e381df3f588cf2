"""Shared fixtures of the quantization tests: the trained digits classifier."""

from __future__ import annotations

import pytest

from modelfleet.zoo import build_digits
from modelfleet.zoo.digits import DigitsModel


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    """The zoo's digits classifier; same cache path as the zoo tests, so it is trained once per session."""
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")
