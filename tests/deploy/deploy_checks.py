"""Helpers of the deploy tests: where deploy/ is, and a check that ``MODELFLEET_*``
variables are real settings."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_settings_apply(settings_class: type[BaseSettings], env: Mapping[str, str]) -> None:
    """Every ``MODELFLEET_*`` variable in ``env`` names a field of ``settings_class`` and
    its value is what the service would run with (pydantic ignores unknown names, so a
    misspelt one would otherwise pass silently)."""
    ours = {k: str(v) for k, v in env.items() if k.startswith("MODELFLEET_")}
    with _environment(ours):
        settings = settings_class()
    for name, raw in ours.items():
        value: Any = settings
        for part in name.removeprefix("MODELFLEET_").lower().split("__"):
            assert hasattr(value, part), f"{name}: {settings_class.__name__} has no setting {part!r}"
            value = getattr(value, part)
        parsed = json.loads(raw) if isinstance(value, dict) else type(value)(raw)
        assert parsed == value, f"{name}={raw!r} did not take effect: {value!r}"
