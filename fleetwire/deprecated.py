"""Settings that moved: the old names keep working for one release, with a FutureWarning.

Both deployables' settings classes call ``adopt_moved`` from a ``mode="before"``
validator, on the raw values that pydantic-settings gathered from the constructor and
the environment (``MODELFLEET_MQTT__HOST`` arrives as ``{"mqtt": {"host": ...}}``). Each
old name found is taken out of its old section and put into the new one, unless the new
name is set too: the new one wins, leaf by leaf for nested sections such as ``tls``. So
only one field holds each value, and nothing reads two places.

A section validated on its own (``MqttSettings(host=...)``) cannot reach the new
section; ``refuse_moved`` makes it fail naming the new setting instead of dropping the
value silently."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["adopt_moved", "refuse_moved"]

#: The env prefix of both deployables' settings.
ENV_PREFIX = "MODELFLEET_"


def adopt_moved(data: Any, *, source: str, target: str, renames: Mapping[str, str]) -> Any:
    """``data`` with each ``source.<old>`` of ``renames`` moved to ``target.<new>`` (a
    FutureWarning per old name set; where both are set the new one wins)."""
    if not isinstance(data, Mapping) or not isinstance(data.get(source), Mapping):
        return data
    old_section: Mapping[str, Any] = data[source]
    found = [old for old in renames if old in old_section]
    if not found:
        return data
    current = _plain(data.get(target))
    if current is None:
        current = {}
    for old in found:
        _warn(source, old, target, renames[old], overridden=isinstance(current, Mapping) and renames[old] in current)
    moved = {renames[old]: old_section[old] for old in found}
    data = dict(data)
    data[source] = {key: value for key, value in old_section.items() if key not in renames}
    data[target] = _merged(moved, current) if isinstance(current, Mapping) else current
    return data


def refuse_moved(data: Any, *, section: str, target: str, renames: Mapping[str, str], owner: str) -> Any:
    """``data`` unchanged; a ValueError naming the new setting when it still uses an old name
    (the section on its own cannot move it: only ``owner``, the settings class, can)."""
    if isinstance(data, Mapping):
        for old in renames:
            if old in data:
                raise ValueError(
                    f"{section}.{old} is {target}.{renames[old]} now ({_env(target, renames[old])}); the old"
                    f" name works for one more release only through {owner}"
                )
    return data


def _merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``old`` updated with ``new``; nested mappings merged key by key, so a new leaf wins over an old one."""
    out = {key: _plain(value) for key, value in old.items()}
    for key, value in new.items():
        value = _plain(value)
        if isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _plain(value: Any) -> Any:
    """A section given as a model counts with the fields it was given, like a dict of them."""
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value


def _warn(source: str, old: str, target: str, new: str, *, overridden: bool) -> None:
    tail = f"; {target}.{new} is set too and wins" if overridden else ""
    warnings.warn(
        f"{source}.{old} ({_env(source, old)}) is deprecated and goes away in the next release:"
        f" use {target}.{new} ({_env(target, new)}){tail}",
        FutureWarning,
        # here, adopt_moved, the validator, pydantic's and pydantic-settings' __init__: the caller
        stacklevel=6,
    )


def _env(section: str, name: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}__{name.upper()}"
