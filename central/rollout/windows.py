"""Maintenance windows: when a node may switch to a rollout's version.

A window is a cron expression in a time zone's wall time (``0 2 * * *`` in
``Europe/Berlin`` opens at 02:00 local, winter and summer) and a duration in real
seconds. A node that some window's selector matches switches only while one of its
windows is open; a node no window matches switches whenever the rollout reaches it.

Daylight saving time, as cron users expect it: a wall time the clocks skip (02:30 on
the spring-forward night) opens when the clocks jump (03:00); a wall time they pass
twice (02:30 on the fall-back night) opens once, at its first pass. Pure functions
over epoch seconds, so the controller's clock (and a test's) is the only clock."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from central.rollout.labels import describe_selector, matches

__all__ = [
    "MaintenanceWindow",
    "describe_window",
    "format_span",
    "may_switch",
    "next_open",
    "switch_opens_at",
    "window_open",
]


class MaintenanceWindow(BaseModel):
    """When the nodes a selector matches may switch versions: a cron schedule and a duration."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    selector: dict[str, str] = Field(default_factory=dict)
    """Label equality match on the nodes' announced labels; empty matches every node."""
    cron: str = Field(min_length=1)
    """When the window opens: five cron fields (minute hour day-of-month month day-of-week),
    in ``tz``'s wall time."""
    duration_s: float = Field(gt=0)
    """How long the window stays open after each opening, in real seconds."""
    tz: str = "UTC"
    """IANA time zone of the cron schedule, e.g. ``Europe/Berlin``."""

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        value = " ".join(value.split())
        if len(value.split(" ")) != 5:
            raise ValueError(f"cron {value!r} must have 5 fields (minute hour day month weekday)")
        if not croniter.is_valid(value):
            raise ValueError(f"cron {value!r} is not a valid cron expression")
        return value

    @field_validator("tz")
    @classmethod
    def _tz(cls, value: str) -> str:
        value = value.strip()
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"tz {value!r} is not a known IANA time zone (e.g. UTC, Europe/Berlin)") from exc
        return value

    @model_validator(mode="after")
    def _opens(self) -> MaintenanceWindow:
        # A valid expression can still never fire (30 February): refuse it at parse time.
        try:
            croniter(self.cron, datetime(2000, 1, 1, tzinfo=ZoneInfo(self.tz))).get_next(datetime)
        except CroniterError as exc:
            raise ValueError(f"cron {self.cron!r} never opens: {exc}") from exc
        return self

    @property
    def zone(self) -> ZoneInfo:
        """The window's time zone."""
        return ZoneInfo(self.tz)


def _second_pass(moment: datetime) -> bool:
    """Whether ``moment`` is the second pass of a wall time the clocks went through twice."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


def _openings_after(window: MaintenanceWindow, after: float) -> Iterator[float]:
    """Opening instants strictly after ``after`` (epoch seconds), in order."""
    schedule = croniter(window.cron, datetime.fromtimestamp(after, window.zone))
    while True:
        moment = schedule.get_next(datetime)
        if not _second_pass(moment):
            yield moment.timestamp()


def _current_opening(window: MaintenanceWindow, now: float) -> float | None:
    """The start of the occurrence that holds ``now``, if any: one in (now − duration, now]."""
    start = next(_openings_after(window, now - window.duration_s))
    return start if start <= now else None


def window_open(window: MaintenanceWindow, now: float) -> bool:
    """Whether ``now`` lies in an occurrence ``[start, start + duration_s)``."""
    return _current_opening(window, now) is not None


def next_open(window: MaintenanceWindow, now: float) -> float:
    """``now`` while the window is open, else when it next opens (epoch seconds)."""
    if window_open(window, now):
        return now
    return next(_openings_after(window, now))


def _closes_at(window: MaintenanceWindow, now: float) -> float | None:
    start = _current_opening(window, now)
    return None if start is None else start + window.duration_s


def _applying(windows: Sequence[MaintenanceWindow], labels: dict[str, str]) -> list[MaintenanceWindow]:
    return [w for w in windows if matches(w.selector, labels)]


def may_switch(windows: Sequence[MaintenanceWindow], labels: dict[str, str], now: float) -> bool:
    """A node no window matches may always switch; a matched node only while one of its windows is open."""
    mine = _applying(windows, labels)
    return not mine or any(window_open(w, now) for w in mine)


def switch_opens_at(windows: Sequence[MaintenanceWindow], labels: dict[str, str], now: float) -> float | None:
    """When the node may next switch: ``now`` if it may now, else its earliest next opening.

    None only when no window matches the node (it is never held back), which callers
    may read as "now"; kept apart so a reason can tell "no window" from "open"."""
    mine = _applying(windows, labels)
    if not mine:
        return None
    return min(next_open(w, now) for w in mine)


def format_span(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 12 min``, ``2 d 5 h``: coarse, for reasons."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    minutes = s // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def _when(cron: str) -> str:
    """``02:00`` for a daily ``M H * * *``, else the expression itself."""
    minute, hour, *rest = cron.split(" ")
    if minute.isdigit() and hour.isdigit() and rest == ["*", "*", "*"]:
        return f"{int(hour):02d}:{int(minute):02d}"
    return f"cron '{cron}'"


def describe_window(window: MaintenanceWindow, now: float) -> str:
    """E.g. ``zone=a: 02:00 Europe/Berlin for 1 h, opens in 3 h 12 min``."""
    head = (
        f"{describe_selector(window.selector)}: {_when(window.cron)} {window.tz} for {format_span(window.duration_s)}"
    )
    closes = _closes_at(window, now)
    if closes is not None:
        return f"{head}, open (closes in {format_span(closes - now)})"
    return f"{head}, opens in {format_span(next_open(window, now) - now)}"
