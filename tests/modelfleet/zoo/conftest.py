"""The zoo's tests share one model cache per session (``tests/modelfleet/test_zoo.py`` uses it too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelfleet.zoo import ZooModel, build_resnet_digits, build_transformer_digits


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "zoo-cache"


@pytest.fixture(scope="session")
def resnet_digits(zoo_cache: Path) -> ZooModel:
    return build_resnet_digits(zoo_cache)


@pytest.fixture(scope="session")
def transformer_digits(zoo_cache: Path) -> ZooModel:
    return build_transformer_digits(zoo_cache)
