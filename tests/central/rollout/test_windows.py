"""Maintenance windows: cron in local wall time across DST, windows over midnight, parse-time
errors, and which nodes a window holds back."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from central.rollout.windows import (
    MaintenanceWindow,
    describe_window,
    may_switch,
    next_open,
    switch_opens_at,
    window_open,
)

BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")
HOUR = 3600.0


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: ZoneInfo = UTC) -> float:
    """Epoch seconds of a wall time in ``tz``."""
    return datetime(year, month, day, hour, minute, tzinfo=tz).timestamp()


def berlin(cron: str, duration_s: float = HOUR, **selector: str) -> MaintenanceWindow:
    return MaintenanceWindow(selector=selector, cron=cron, duration_s=duration_s, tz="Europe/Berlin")


def test_window_follows_local_wall_time_across_spring_forward() -> None:
    w = berlin("0 1 * * *")
    # Winter (UTC+1): 01:00 Berlin is 00:00 UTC.
    assert window_open(w, at(2026, 3, 28, 0, 30))
    assert not window_open(w, at(2026, 3, 27, 23, 30))
    # Summer (UTC+2) after the switch on 29 March: 01:00 Berlin is 23:00 UTC the day before.
    assert window_open(w, at(2026, 3, 30, 23, 30))
    assert not window_open(w, at(2026, 3, 31, 0, 30))
    assert next_open(w, at(2026, 3, 30, 12)) == at(2026, 3, 31, 1, tz=BERLIN) == at(2026, 3, 30, 23)


def test_skipped_wall_time_opens_when_the_clocks_jump() -> None:
    # 02:30 does not exist in Berlin on 29 March 2026 (02:00 CET → 03:00 CEST).
    w = berlin("30 2 * * *", duration_s=1800)
    assert next_open(w, at(2026, 3, 28, 12, tz=BERLIN)) == at(2026, 3, 29, 3, tz=BERLIN) == at(2026, 3, 29, 1)
    assert window_open(w, at(2026, 3, 29, 1, 10))
    assert not window_open(w, at(2026, 3, 29, 1, 30))  # the duration is real seconds


def test_repeated_wall_time_opens_once_on_fall_back() -> None:
    # 02:30 happens twice in Berlin on 25 October 2026: 00:30 UTC (CEST) and 01:30 UTC (CET).
    w = berlin("30 2 * * *", duration_s=1800)
    assert window_open(w, at(2026, 10, 25, 0, 45))
    assert not window_open(w, at(2026, 10, 25, 1, 45))
    assert next_open(w, at(2026, 10, 25, 1, 0)) == at(2026, 10, 26, 2, 30, tz=BERLIN) == at(2026, 10, 26, 1, 30)


def test_window_spanning_midnight() -> None:
    friday_night = MaintenanceWindow(cron="0 23 * * 5", duration_s=3 * HOUR)  # Fri 23:00 to Sat 02:00 UTC
    assert window_open(friday_night, at(2026, 12, 4, 23, 0))  # opens exactly on time
    assert window_open(friday_night, at(2026, 12, 5, 1, 59))  # Saturday, still open
    assert not window_open(friday_night, at(2026, 12, 5, 2, 0))  # closes exactly after 3 h
    assert not window_open(friday_night, at(2026, 12, 3, 23, 30))  # Thursday night
    assert next_open(friday_night, at(2026, 12, 5, 2, 0)) == at(2026, 12, 11, 23)
    assert next_open(friday_night, at(2026, 12, 5, 1)) == at(2026, 12, 5, 1)  # open: now


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 2 * *", "5 fields"),
        ("0 0 2 * * *", "5 fields"),
        ("61 2 * * *", "not a valid cron"),
        ("0 2 * * mon-xyz", "not a valid cron"),
        ("0 0 31 2 *", "never opens"),
    ],
)
def test_bad_cron_is_refused_at_parse_time(cron: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MaintenanceWindow(cron=cron, duration_s=60)


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "../../etc/passwd", ""])
def test_unknown_time_zone_is_refused(tz: str) -> None:
    with pytest.raises(ValidationError, match="not a known IANA time zone"):
        MaintenanceWindow(cron="0 2 * * *", duration_s=60, tz=tz)


def test_duration_must_be_positive_and_fields_known() -> None:
    with pytest.raises(ValidationError):
        MaintenanceWindow(cron="0 2 * * *", duration_s=0)
    with pytest.raises(ValidationError):
        MaintenanceWindow.model_validate({"cron": "0 2 * * *", "duration_s": 60, "timezone": "UTC"})
    parsed = MaintenanceWindow.model_validate({"cron": " 0  2 * * * ", "duration_s": 60})
    assert (parsed.cron, parsed.tz, parsed.selector) == ("0 2 * * *", "UTC", {})


def test_selector_decides_which_nodes_wait() -> None:
    zone_a = MaintenanceWindow(selector={"zone": "a"}, cron="0 2 * * *", duration_s=HOUR)
    gpu = MaintenanceWindow(selector={"tier": "gpu"}, cron="0 4 * * *", duration_s=HOUR)
    windows = [zone_a, gpu]
    noon, half_past_two, half_past_four = at(2026, 12, 4, 12), at(2026, 12, 4, 2, 30), at(2026, 12, 4, 4, 30)
    # Matched by no window: switches any time; no opening to wait for.
    assert may_switch(windows, {"zone": "b"}, noon) and switch_opens_at(windows, {"zone": "b"}, noon) is None
    # Matched by one window: only while it is open.
    assert not may_switch(windows, {"zone": "a"}, noon)
    assert may_switch(windows, {"zone": "a"}, half_past_two)
    assert switch_opens_at(windows, {"zone": "a"}, noon) == at(2026, 12, 5, 2)
    # Matched by both: either one open will do; the earliest opening counts.
    both = {"zone": "a", "tier": "gpu"}
    assert may_switch(windows, both, half_past_two) and may_switch(windows, both, half_past_four)
    assert not may_switch(windows, both, noon)
    assert switch_opens_at(windows, both, at(2026, 12, 4, 3, 30)) == at(2026, 12, 4, 4)
    assert switch_opens_at(windows, both, half_past_four) == half_past_four
    # An empty selector holds every node.
    everyone = [MaintenanceWindow(cron="0 2 * * *", duration_s=HOUR)]
    assert not may_switch(everyone, {}, noon) and may_switch([], {}, noon)


def test_describe_window_says_when() -> None:
    w = berlin("0 2 * * *", zone="a")
    now = at(2026, 12, 4, 22, 48, tz=BERLIN)
    assert describe_window(w, now) == "zone=a: 02:00 Europe/Berlin for 1 h, opens in 3 h 12 min"
    assert describe_window(w, at(2026, 12, 5, 2, 20, tz=BERLIN)) == (
        "zone=a: 02:00 Europe/Berlin for 1 h, open (closes in 40 min)"
    )
    weekly = MaintenanceWindow(cron="30 1 * * 6", duration_s=5400)
    assert describe_window(weekly, at(2026, 12, 4, 12)) == (
        "(every node): cron '30 1 * * 6' UTC for 1 h 30 min, opens in 13 h 30 min"
    )
