"""Waves: how many of a rollout's targets get the version at each step, in which order,
and how fast nodes are let in.

A wave spec is cumulative: ``["1", "10%", "50%", "100%"]`` lets one node in, then up to
a tenth of the targets in total, then half, then all. The order is the canary order
(``sha256(model:version:node)``, as :func:`central.rollout.progress.choose_canaries`), so
the legacy ``canary`` fraction is the wave list ``[canary %, 100%]`` and its first wave is
exactly today's canaries. Pure functions over plain values."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence

__all__ = [
    "WINDOW_S",
    "WaveSpec",
    "admit",
    "canary_waves",
    "next_admission_at",
    "normalize_waves",
    "order_targets",
    "parse_wave",
    "wave_sizes",
]

WaveSpec = int | str
#: The rate limit's sliding window: ``rate_per_min`` admissions per minute.
WINDOW_S = 60.0
_ALL = "100%"


def parse_wave(spec: WaveSpec) -> tuple[float, bool]:
    """``(value, is_percent)`` for ``3``, ``"3"`` or ``"12.5%"``; ValueError with the reason otherwise."""
    if isinstance(spec, bool) or not isinstance(spec, int | str):  # bool is an int; True is not a wave
        raise ValueError(f"wave {spec!r} must be a node count or a percentage")
    if isinstance(spec, int):
        text, percent = str(spec), False
    else:
        text = spec.strip()
        percent = text.endswith("%")
        text = text[:-1].strip() if percent else text
    try:
        value = float(text) if percent else int(text)
    except ValueError:
        raise ValueError(f"wave {spec!r} must be a node count (e.g. 5) or a percentage (e.g. 10%)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"wave {spec!r} must be more than 0")
    if percent and value > 100:
        raise ValueError(f"wave {spec!r} is more than 100%")
    return value, percent


def normalize_waves(specs: Sequence[WaveSpec]) -> list[str]:
    """The specs as strings (validated), with ``100%`` appended unless the last one is it."""
    out: list[str] = []
    for spec in specs:
        value, percent = parse_wave(spec)
        out.append(f"{value:.12g}%" if percent else str(int(value)))
    if not out or out[-1] != _ALL:
        out.append(_ALL)
    return out


def _resolve(spec: str, n_targets: int) -> int:
    value, percent = parse_wave(spec)
    # The same rounding as choose_canaries, so [canary %, 100%] picks today's canaries.
    count = math.ceil(value / 100 * n_targets - 1e-9) if percent else int(value)
    return max(1, min(n_targets, count))


def wave_sizes(specs: Sequence[WaveSpec], n_targets: int) -> list[int]:
    """Cumulative node counts per wave: at least 1, never decreasing, the last is ``n_targets``.

    One entry per spec of :func:`normalize_waves` (a wave may add no node when targets are
    few: ``["1", "10%"]`` on 5 nodes is ``[1, 1, 5]``); all zeros when there are no targets."""
    normal = normalize_waves(specs)
    if n_targets <= 0:
        return [0] * len(normal)
    sizes: list[int] = []
    for spec in normal:
        sizes.append(max(_resolve(spec, n_targets), sizes[-1] if sizes else 1))
    return sizes


def order_targets(model: str, version: str, targets: Iterable[str]) -> list[str]:
    """Targets in wave order: by ``sha256(model:version:node)``, stable across restarts and
    centrals, different per version (so the same nodes do not always go first)."""

    def rank(node_id: str) -> str:
        return hashlib.sha256(f"{model}:{version}:{node_id}".encode()).hexdigest()

    return sorted(set(targets), key=lambda n: (rank(n), n))


def canary_waves(canary: float) -> list[str]:
    """The legacy ``canary`` fraction as waves: ``0.1`` → ``["10%", "100%"]``, ``1`` → ``["100%"]``."""
    if not 0 < canary <= 1:
        raise ValueError(f"canary {canary!r} must be in (0, 1]")
    return normalize_waves([f"{canary * 100:.12g}%"])


def _limits(rate_per_min: float) -> tuple[float, int]:
    """``(window seconds, admissions per window)``: ``rate`` per minute for rates of 1 and
    more, one node per ``60 / rate`` seconds below that."""
    window = WINDOW_S * max(1.0, 1.0 / rate_per_min)
    return window, max(1, math.floor(rate_per_min * window / WINDOW_S + 1e-9))


def admit(
    ordered_wave_nodes: Sequence[str],
    admitted: dict[str, float],
    rate_per_min: float | None,
    now: float,
) -> list[str]:
    """The nodes of the current wave (in wave order) that may be let in now.

    ``admitted`` maps every node already let in to when; with a rate, no sliding window of
    60 s holds more than ``rate_per_min`` admissions (below 1 per minute: one per
    ``60 / rate`` s). ``None`` lets the whole wave in at once."""
    waiting = [n for n in ordered_wave_nodes if n not in admitted]
    if rate_per_min is None:
        return waiting
    if rate_per_min <= 0:
        raise ValueError(f"rate_per_min {rate_per_min!r} must be more than 0")
    window, allowed = _limits(rate_per_min)
    recent = sum(1 for at in admitted.values() if now - window < at <= now)
    return waiting[: max(0, allowed - recent)]


def next_admission_at(admitted: dict[str, float], rate_per_min: float | None, now: float) -> float:
    """When :func:`admit` may next let a node in (``now`` if it may now): for reasons and timers."""
    if rate_per_min is None:
        return now
    window, allowed = _limits(rate_per_min)
    recent = sorted(at for at in admitted.values() if now - window < at <= now)
    if len(recent) < allowed:
        return now
    return recent[len(recent) - allowed] + window
