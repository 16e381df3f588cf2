"""Waves: cumulative sizes from counts and percentages, the stable node order (today's canaries
as wave 1), the rate limit's sliding window, and the rollout request's wave list."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from central.rollout.model import Rollout, RolloutRequest
from central.rollout.progress import choose_canaries
from central.rollout.waves import (
    admit,
    canary_waves,
    next_admission_at,
    normalize_waves,
    order_targets,
    wave_sizes,
)

NODES = [f"edge-{i:03d}" for i in range(100)]


@pytest.mark.parametrize(
    ("specs", "n", "sizes"),
    [
        (["1", "10%", "50%", "100%"], 100, [1, 10, 50, 100]),
        (["1", "10%", "50%", "100%"], 5, [1, 1, 3, 5]),  # 10% of 5 rounds up to 1
        ([1, "10%", "50%"], 7, [1, 1, 4, 7]),  # ints; 100% appended
        (["3", "50"], 10, [3, 10, 10]),  # counts past the targets stop at all of them
        (["33%"], 10, [4, 10]),  # ceil
        (["12.5%", "25%"], 8, [1, 2, 8]),
        (["50%", "5"], 20, [10, 10, 20]),  # never decreasing
        (["100%"], 1, [1]),
        (["1", "10%", "100%"], 0, [0, 0, 0]),
    ],
)
def test_wave_sizes(specs: list[int | str], n: int, sizes: list[int]) -> None:
    assert wave_sizes(specs, n) == sizes


@pytest.mark.parametrize("bad", ["0", 0, "-1", "0%", "101%", "ten", "10 %%", "nan%", "1.5", True, 1.5, None, ""])
def test_bad_wave_specs_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="wave"):
        wave_sizes(["1", bad], 10)  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="wave"):
        RolloutRequest(version="2", waves=["1", bad])


def test_normalized_waves_are_stable_strings() -> None:
    assert normalize_waves([1, " 10 % ", "50%"]) == ["1", "10%", "50%", "100%"]
    assert normalize_waves(normalize_waves(["2", "12.5%"])) == ["2", "12.5%", "100%"]
    assert RolloutRequest(version="2").waves is None  # the canary fraction, then everyone
    request = RolloutRequest.model_validate({"version": "2", "waves": [1, "25%"], "rate_per_min": 5})
    assert request.waves == ["1", "25%", "100%"]
    with pytest.raises(ValidationError):
        RolloutRequest(version="2", waves=[])
    with pytest.raises(ValidationError):
        RolloutRequest(version="2", rate_per_min=0)


def test_order_is_stable_and_differs_per_version() -> None:
    order = order_targets("m", "2", NODES)
    assert order_targets("m", "2", list(reversed(NODES))) == order  # input order does not matter
    assert sorted(order) == NODES
    assert order != NODES and order_targets("m", "3", NODES) != order
    # A node joining later takes its own place; the others keep their relative order.
    grown = order_targets("m", "2", [*NODES, "edge-new"])
    assert [n for n in grown if n != "edge-new"] == order


@pytest.mark.parametrize("canary", [0.01, 0.05, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0])
def test_legacy_canary_fraction_is_wave_one(canary: float) -> None:
    waves = canary_waves(canary)
    assert waves[-1] == "100%" and len(waves) == (1 if canary == 1 else 2)
    for n in range(1, 60):
        targets = NODES[:n]
        rollout = Rollout(model="digits", version="7", canary=canary)
        first = wave_sizes(waves, n)[0]
        assert sorted(order_targets("digits", "7", targets)[:first]) == choose_canaries(rollout, targets)


def test_no_rate_admits_the_whole_wave() -> None:
    wave = order_targets("m", "2", NODES)[:10]
    assert admit(wave, {}, None, 0.0) == wave
    assert admit(wave, {n: 0.0 for n in wave[:4]}, None, 1.0) == wave[4:]


def test_rate_limit_holds_in_every_sliding_minute() -> None:
    wave = order_targets("m", "2", NODES)
    admitted: dict[str, float] = {}
    for tick in range(0, 600):  # the controller evaluates every second for 10 minutes
        now = tick * 1.0 + 0.25
        new = admit(wave, admitted, 3, now)
        assert new == [n for n in wave if n not in admitted][: len(new)]  # in wave order
        admitted.update(dict.fromkeys(new, now))
    times = sorted(admitted.values())
    for start in times:  # every window that starts at an admission
        assert sum(1 for t in times if start <= t < start + 60) <= 3
    assert len(admitted) == 30  # and the limit is used, not undercut


def test_rate_limit_window_slides() -> None:
    wave = ["a", "b", "c", "d", "e"]
    assert admit(wave, {}, 2, 0.0) == ["a", "b"]
    assert admit(wave, {"a": 0.0, "b": 45.0}, 2, 59.0) == []
    assert admit(wave, {"a": 0.0, "b": 45.0}, 2, 60.0) == ["c"]  # a left the window, b is still in it
    assert next_admission_at({"a": 0.0, "b": 45.0}, 2, 59.0) == 60.0
    assert admit(wave, {"a": 0.0, "b": 45.0}, 2, 105.0) == ["c", "d"]
    assert next_admission_at({"a": 0.0, "b": 45.0}, 2, 105.0) == 105.0


def test_rate_below_one_per_minute_spaces_nodes_out() -> None:
    wave = ["a", "b", "c"]
    assert admit(wave, {}, 0.5, 0.0) == ["a"]
    assert admit(wave, {"a": 0.0}, 0.5, 119.0) == []
    assert next_admission_at({"a": 0.0}, 0.5, 10.0) == 120.0
    assert admit(wave, {"a": 0.0}, 0.5, 120.0) == ["b"]
    with pytest.raises(ValueError, match="rate_per_min"):
        admit(wave, {}, 0, 0.0)
