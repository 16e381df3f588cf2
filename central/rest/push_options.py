"""The quantization options of a push, from its query string.

``threshold`` (0..1): the accuracy guard's threshold for this push, compared with
the lower confidence bound of INT8's agreement with FP32; ``dim`` (repeatable,
``name=value``): the size of a named dynamic dimension in generated guard samples
(``dim=seq=128``); ``require_int8`` (true/false): refuse the push (422) when INT8 cannot be
made or proven, instead of storing and serving it as FP32. Bad values are a 400 that names
the option, before the body is read."""

from __future__ import annotations

import math

from starlette.datastructures import QueryParams

from central.errors import BadRequest
from central.handlers.registry import PushOptions
from central.rest.uploads import parse_flag

MAX_DIM = 1 << 20


def parse_threshold(raw: str | None) -> float | None:
    """A number in 0..1, or None when absent; 400 otherwise."""
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"threshold must be a number between 0 and 1, got {raw!r}") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise BadRequest(f"threshold must be between 0 and 1 (0.97 means 97 %), got {raw!r}")
    return value


def parse_dims(raw: list[str]) -> dict[str, int]:
    """``["seq=128", "height=224,width=224"]`` → ``{"seq": 128, ...}``; 400 on a bad pair."""
    dims: dict[str, int] = {}
    for item in raw:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = pair.partition("=")
            name = name.strip()
            if not sep or not name or not value.strip().isdigit():
                raise BadRequest(f"dim {pair!r} is not of the form name=size (a positive integer)")
            size = int(value)
            if not 1 <= size <= MAX_DIM:
                raise BadRequest(f"dim {pair!r}: the size must be between 1 and {MAX_DIM}")
            dims[name] = size
    return dims


def push_options(query: QueryParams) -> PushOptions:
    """The options of a push request (see the module docstring)."""
    return PushOptions(
        parse_threshold(query.get("threshold")),
        parse_dims(query.getlist("dim")),
        require_int8=parse_flag("require_int8", query.get("require_int8")),
    )
