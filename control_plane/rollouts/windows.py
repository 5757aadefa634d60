"""Maintenance windows: when the devices of a label selector may start an update.

A window opens at the times of a five-field cron expression (minute, hour, day of month, month,
day of week; ``*``, ``a-b``, ``*/n``, ``a-b/n`` and lists), read in the local time of an IANA
time zone, daylight saving included, and stays open ``duration_s``. As in cron, when both day
fields are restricted a day matches either. A device that one or more windows select may start
an update only while one of them is open; a device no window selects, at any time. The rollout
engine sends a wave's device whose windows are all closed its manifest at once, marked
``activate_after`` the next opening: the device downloads and verifies it ahead, and switches
no earlier than that (by its own clock); its device timeout counts from the opening, and the
wave waits for it. A device whose windows do not open before half the manifest's lifetime is
held ``pending`` (its reason says until when) and sent its manifest at the first step after one
opens.

NOTE: a start in the hour a spring-forward skips is taken at the offset before the change
(``zoneinfo`` with ``fold=0``), and one in the hour a fall-back repeats, at its first
occurrence. An agent that predates ``activate_after`` ignores it and switches at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from control_plane.db.models import Device, MaintenanceWindow

RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
NAMES = ("minute", "hour", "day of month", "month", "day of week")
MAX_DURATION_S = 7 * 86400.0
SEARCH_DAYS = 4 * 366
"""How far ahead a next opening is looked for (a 29 February on a Monday comes within 28
years; nothing that rare is worth waiting for: such a window is refused as never opening)."""


def _field(text: str, index: int) -> frozenset[int]:
    low, high = RANGES[index]
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                start, end = low, high
            elif "-" in body:
                a, b = body.split("-", 1)
                start, end = int(a), int(b)
            else:
                start = end = int(body)
                if step_text:  # "5/15": from 5 to the end, as cron reads it
                    end = high
        except ValueError:
            raise ValueError(f"cron {NAMES[index]} {part!r}: not a number, range or step") from None
        if step < 1 or not low <= start <= end <= high:
            raise ValueError(f"cron {NAMES[index]} {part!r}: outside {low}-{high}")
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:  # Sunday is 0 or 7
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday."""
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Raises ValueError naming the field."""
        parts = text.split()
        if len(parts) != 5:
            raise ValueError(f"cron {text!r}: five fields (minute hour day month weekday)")
        minutes, hours, days, months, weekdays = (_field(p, i) for i, p in enumerate(parts))
        return cls(
            minutes,
            hours,
            days,
            months,
            weekdays,
            any_day=parts[2] == "*",
            any_weekday=parts[4] == "*",
        )

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        by_day, by_weekday = d.day in self.days, (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_day and by_weekday
        return by_day or by_weekday  # NOTE: cron's rule when both are restricted

    def starts(self, *, reverse: bool = False) -> Iterator[tuple[int, int]]:
        hours, minutes = sorted(self.hours, reverse=reverse), sorted(self.minutes, reverse=reverse)
        for hour in hours:
            for minute in minutes:
                yield hour, minute


@dataclass(frozen=True)
class Window:
    name: str
    cron: Cron
    duration: timedelta
    zone: ZoneInfo

    @classmethod
    def of(cls, name: str, cron: str, duration_s: float, timezone: str) -> Window:
        """Raises ValueError: a bad cron expression, duration or time zone."""
        if not 0 < duration_s <= MAX_DURATION_S:
            raise ValueError(f"duration_s {duration_s}: more than 0, at most {MAX_DURATION_S:g}")
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {timezone!r}: not an IANA time zone name") from None
        return cls(name, Cron.parse(cron), timedelta(seconds=duration_s), zone)

    def _start(self, day: date, hour: int, minute: int) -> datetime:
        local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.zone)
        return local.astimezone(UTC)

    def last_start(self, now: datetime) -> datetime | None:
        """The latest opening at or before ``now`` within one duration of it, else None."""
        today = now.astimezone(self.zone).date()
        for back in range(self.duration.days + 2):
            day = today - timedelta(days=back)
            if not self.cron.day_matches(day):
                continue
            for hour, minute in self.cron.starts(reverse=True):
                start = self._start(day, hour, minute)
                if start <= now:
                    return start if now < start + self.duration else None
        return None

    def is_open(self, now: datetime) -> bool:
        return self.last_start(now) is not None

    def next_start(self, now: datetime) -> datetime | None:
        """The first opening after ``now`` (None: none within SEARCH_DAYS)."""
        today = now.astimezone(self.zone).date()
        for ahead in range(SEARCH_DAYS):
            day = today + timedelta(days=ahead)
            if not self.cron.day_matches(day):
                continue
            for hour, minute in self.cron.starts():
                start = self._start(day, hour, minute)
                if start > now:
                    return start
        return None


def window_of(row: MaintenanceWindow) -> Window:
    return Window.of(row.name, row.cron, row.duration_s, row.timezone)


async def held_devices(
    session: AsyncSession, device_ids: list[str], now: datetime
) -> dict[str, tuple[str, datetime | None]]:
    """Of ``device_ids``, those whose windows are all closed at ``now``: per device, the window
    that opens first and when (None: never)."""
    rows = list((await session.execute(select(MaintenanceWindow))).scalars())
    if not rows or not device_ids:
        return {}
    windows = [(row.selector, window_of(row)) for row in rows]
    opening = {w.name: (w.is_open(now), w.next_start(now)) for _, w in windows}
    held: dict[str, tuple[str, datetime | None]] = {}
    for start in range(0, len(device_ids), 1000):
        chunk = device_ids[start : start + 1000]
        labels = await session.execute(
            select(Device.id, Device.reported_labels, Device.operator_labels).where(
                Device.id.in_(chunk)
            )
        )
        for device_id, reported, operator in labels:
            merged = {**reported, **operator}
            mine = [
                w for selector, w in windows if all(merged.get(k) == v for k, v in selector.items())
            ]
            if not mine or any(opening[w.name][0] for w in mine):
                continue
            nexts = [(opening[w.name][1], w.name) for w in mine]
            dated = sorted((t, n) for t, n in nexts if t is not None)
            held[device_id] = (dated[0][1], dated[0][0]) if dated else (nexts[0][1], None)
    return held


def held_reason(name: str, opens: datetime | None, *, ahead: bool = False) -> str:
    if ahead and opens is not None:
        return f"downloading ahead of maintenance window {name}: switches at {opens.isoformat()}"
    when = f"opens {opens.isoformat()}" if opens else "never opens"
    return f"waiting for maintenance window {name} ({when})"
