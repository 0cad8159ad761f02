"""Cron expressions exactly as the Spooled server reads them, and when one fires next (sans-I/O).

Grammar: 6 fields `second minute hour day-of-month month day-of-week`, or 5 without the seconds (they
are then 0). Each field is one of `*`, `*/N` (N from 1 to the field's maximum), `a-b` (a <= b, both in
range), a list `a,b,c` of single values, or one value; values are decimal (an optional leading `+`, as
the server's integer parser takes it), day-of-week 0-6 with Sunday 0. Nothing else: no names (MON, JAN),
no macros (@daily), no `?`, `L`, `W` or `#`, no step on a range (`1-10/2`), no range in a list. Note
the server's quirks, kept: `*/N` matches the values divisible by N (so day-of-month `*/5` is 5, 10, ...),
and day-of-month and day-of-week must both match.

`next_after(schedule, after)` walks forward from the second after `after` with the server's steps (to the
next hour while minute and hour both miss, to the next minute while the minute misses, one second while
only the second misses, else a minute) for at most MAX_STEPS steps, so it answers the instant the server
would, or None where the server gives up. Times are epoch seconds, read in UTC.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

MAX_STEPS = 525600
_NUMBER = re.compile(r"\+?[0-9]+")
BOUNDS = (("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31), ("month", 1, 12),
          ("day_of_week", 0, 6))


class CronError(ValueError):
    """Why an expression is refused, in the server's words."""


@dataclass(frozen=True)
class Field:
    """One field: `step` for `*/N`, else the set of values it matches (None for `*`)."""

    values: frozenset[int] | None
    step: int = 0

    def matches(self, v: int) -> bool:
        if self.step:
            return v % self.step == 0
        return self.values is None or v in self.values


@dataclass(frozen=True)
class Schedule:
    second: Field
    minute: Field
    hour: Field
    day_of_month: Field
    month: Field
    day_of_week: Field


def _u8(text: str) -> int | None:
    """The server's unsigned 8-bit parse: digits with an optional `+`, at most 255; else None."""
    if not _NUMBER.fullmatch(text):
        return None
    v = int(text)
    return v if v <= 255 else None


def _step(text: str, hi: int) -> Field:
    step = _u8(text)
    if step is None:
        raise CronError(f"Invalid step value: {text}")
    if step == 0:
        raise CronError("Step value cannot be 0 - would cause infinite loop")
    if step > hi:
        raise CronError(f"Step value {step} exceeds maximum {hi} for this field")
    return Field(None, step)


def _range(text: str, lo: int, hi: int) -> Field:
    parts = text.split("-")
    if len(parts) != 2:
        raise CronError(f"Invalid range: {text}")
    start, end = _u8(parts[0]), _u8(parts[1])
    if start is None:
        raise CronError(f"Invalid range start: {parts[0]}")
    if end is None:
        raise CronError(f"Invalid range end: {parts[1]}")
    if start > end or start < lo or end > hi:
        raise CronError(f"Range out of bounds: {start}-{end}")
    return Field(frozenset(range(start, end + 1)))


def _list(text: str, lo: int, hi: int) -> Field:
    values = []
    for part in text.split(","):
        v = _u8(part)
        if v is None:
            raise CronError(f"Invalid list value in: {text}")
        values.append(v)
    for v in values:
        if v < lo or v > hi:
            raise CronError(f"List value out of bounds: {v}")
    return Field(frozenset(values))


def _field(text: str, lo: int, hi: int) -> Field:
    """One field, tried in the server's order: `*`, `*/N`, a range (any `-`), a list (any `,`), a value."""
    if text == "*":
        return Field(None)
    if text.startswith("*/"):
        return _step(text[2:], hi)
    if "-" in text:
        return _range(text, lo, hi)
    if "," in text:
        return _list(text, lo, hi)
    value = _u8(text)
    if value is None:
        raise CronError(f"Invalid field value: {text}")
    if value < lo or value > hi:
        raise CronError(f"Value out of bounds: {value}")
    return Field(frozenset((value,)))


def parse(expression: str) -> Schedule:
    """The schedule an expression names, or CronError (the message the server puts after
    "Invalid cron expression: ")."""
    parts = expression.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    if len(parts) != 6:
        raise CronError(f"expected 5 or 6 fields, got {len(parts)}")
    return Schedule(*(_field(p, lo, hi) for p, (_, lo, hi) in zip(parts, BOUNDS, strict=True)))


def next_after(s: Schedule, after: float) -> float | None:
    """The first instant the schedule fires strictly after `after` (whole seconds), or None."""
    t = int(after // 1) + 1
    day_key, day_ok = None, False
    for _ in range(MAX_STEPS):
        sec, minute, hour = t % 60, t // 60 % 60, t // 3600 % 24
        day = t // 86400
        if day != day_key:
            g = time.gmtime(t)
            day_key = day
            day_ok = (s.day_of_month.matches(g.tm_mday) and s.month.matches(g.tm_mon)
                      and s.day_of_week.matches((g.tm_wday + 1) % 7))
        m_ok, h_ok, s_ok = s.minute.matches(minute), s.hour.matches(hour), s.second.matches(sec)
        if s_ok and m_ok and h_ok and day_ok:
            return float(t)
        if not m_ok and not h_ok:
            t += 3600 - minute * 60 - sec
        elif not m_ok:
            t += 60 - sec
        elif not s_ok:
            t += 1
        else:
            t += 60
    return None


# The time zones the server accepts (it stores the name; it reads the expression in UTC).
TIMEZONES = frozenset((
    "UTC", "GMT", "America/New_York", "America/Los_Angeles", "America/Chicago", "America/Denver", "America/Toronto",
    "America/Vancouver", "America/Mexico_City", "America/Sao_Paulo", "Europe/London", "Europe/Paris",
    "Europe/Berlin", "Europe/Moscow", "Europe/Rome", "Asia/Tokyo", "Asia/Shanghai", "Asia/Singapore",
    "Asia/Hong_Kong", "Asia/Seoul", "Asia/Dubai", "Asia/Kolkata", "Asia/Bangkok", "Australia/Sydney",
    "Australia/Melbourne", "Australia/Perth", "Pacific/Auckland", "Pacific/Honolulu", "Africa/Cairo",
    "Africa/Johannesburg", "Africa/Lagos"))


def timezone_ok(name: str) -> bool:
    """An accepted time zone: one of TIMEZONES, any `Etc/GMT...`, or an offset written `+hh:mm` / `-hh:mm`
    (six characters with the colon third; the server checks no more than that)."""
    if name in TIMEZONES or name.startswith("Etc/GMT"):
        return True
    return name[:1] in ("+", "-") and len(name.encode()) == 6 and name[3:4] == ":"
