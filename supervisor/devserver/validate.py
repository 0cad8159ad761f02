"""Request validation with the real server's error shapes.

Absent required field -> 422 missing_field; wrong JSON type -> 422 invalid_type;
a value of the right type that breaks a rule -> 400 VALIDATION_ERROR. JSON null
counts as absent for optional fields.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from .errors import field_hint, invalid_json, invalid_type, missing_field, validation

_ASCII_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_MISSING = object()


def check_url(url: str, field: str = "url") -> str:
    """A URL the dev server will POST to (a webhook's, a job's `completion_webhook`): at most 2048
    characters, no whitespace or control characters, http or https, with a host; else 400 `invalid_url`."""
    if len(url) > 2048:
        raise validation(field, "length must be at most 2048", "length")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise validation(field, "Invalid URL: contains whitespace or control characters", "invalid_url")
    try:
        u = urlsplit(url)
        _ = u.port
    except ValueError as e:
        raise validation(field, f"Invalid URL: {e}", "invalid_url") from None
    if u.scheme not in ("http", "https"):
        raise validation(field, "URL must use HTTP or HTTPS scheme", "invalid_url")
    if not u.hostname:
        raise validation(field, "Invalid URL: empty host", "invalid_url")
    return url


def _queue_chars_ok(name: str) -> bool:
    return all(c.isalnum() or c in "-_." for c in name)


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
                      r"(?:([Zz])|([+-])(\d{2}):(\d{2}))")
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days from 1970-01-01 to a proleptic Gregorian date (year 0 included)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def parse_time(field: str, value) -> float:
    """An RFC 3339 date-time with its offset (`Z` or +hh:mm) -> epoch seconds, as the server's date type
    reads one: no other ISO 8601 form (no bare date, no missing offset, no week dates), fields in range, the
    instant within years 0000-9999. A non-string is 422 invalid_type; a string that is not one, 400
    INVALID_JSON (a deserialisation error, as the server answers it)."""
    if not isinstance(value, str):
        raise invalid_type(field, "an RFC 3339 date-time string")
    m = _RFC3339.fullmatch(value)
    if m is None:
        short = len(value) < 20 and all(c.isdigit() or c in "-T:. " for c in value)
        why = "premature end of input" if short else "input contains invalid characters"
        raise invalid_json(f"{field}: {why}")
    y, mo, d, hh, mi, ss = (int(m.group(i)) for i in range(1, 7))
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    days_in = _MONTH_DAYS[mo - 1] + (mo == 2 and leap) if 1 <= mo <= 12 else 0
    off = 0
    if m.group(9):
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise invalid_json(f"{field}: input is out of range")
        off = (oh * 3600 + om * 60) * (1 if m.group(9) == "+" else -1)
    if not (1 <= d <= days_in and hh <= 23 and mi <= 59 and ss <= 59):
        raise invalid_json(f"{field}: input is out of range")
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    sec = _days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss - off
    if not -62167219200 <= sec <= 253402300799:
        raise invalid_json(f"{field}: input is out of range")
    return sec + micro / 1e6


class Body:
    """Typed accessors over a parsed JSON object body."""

    def __init__(self, data):
        if not isinstance(data, dict):
            raise invalid_type("body", "a JSON object")
        self.d = data

    def _get(self, name, required):
        v = self.d.get(name, _MISSING)
        if v is _MISSING or v is None:
            if required:
                raise missing_field(name, field_hint(name, self.d))
            return _MISSING
        return v

    def str(self, name, required=False, min_len=1, max_len=255, default=None):
        v = self._get(name, required)
        if v is _MISSING:
            return default
        if not isinstance(v, str):
            raise invalid_type(name, "a string")
        if len(v) < min_len or len(v) > max_len:
            raise validation(name, f"length must be between {min_len} and {max_len}", "length")
        return v

    def int(self, name, required=False, lo=None, hi=None, default=None):
        v = self._get(name, required)
        if v is _MISSING:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise invalid_type(name, "an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise validation(name, f"must be between {lo} and {hi}", "range")
        return v

    def bool(self, name, required=False, default=None):
        v = self._get(name, required)
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            raise invalid_type(name, "a boolean")
        return v

    def any(self, name, required=False):
        """Any JSON value; returns _MISSING-free: (present, value)."""
        v = self.d.get(name, _MISSING)
        if v is _MISSING:
            if required:
                raise missing_field(name, field_hint(name, self.d))
            return False, None
        return True, v

    def time(self, name):
        v = self._get(name, False)
        return None if v is _MISSING else parse_time(name, v)

    def list(self, name, required=False, max_len=100, min_len=0):
        v = self._get(name, required)
        if v is _MISSING:
            return None
        if not isinstance(v, list):
            raise invalid_type(name, "an array")
        if len(v) < min_len or len(v) > max_len:
            raise validation(name, f"must contain between {min_len} and {max_len} items", "length")
        return v

    # --- domain rules ---
    def queue_name(self, name="queue_name", required=True):
        q = self.str(name, required, 1, 100)
        if q is not None:
            check_queue_name(q, name)
        return q


def check_queue_name(q: str, field: str = "queue_name") -> str:
    """The one rule for a queue a job, worker, workflow job or schedule names (what a claim accepts): 1-100
    characters, alphanumeric or `-_.`, not starting with `.` or `-`; else 400 VALIDATION_ERROR on `field`."""
    if not q or len(q) > 100:
        raise validation(field, "length must be between 1 and 100", "length")
    if not _queue_chars_ok(q):
        raise validation(field, "Queue name contains invalid characters", "invalid_queue_name")
    if q[0] in ".-":
        raise validation(field, "Queue name cannot start with dots or dashes", "invalid_queue_name_start")
    return q


def check_worker_id(w: str, field: str = "worker_id") -> str:
    if not _ASCII_ID.match(w) or len(w) > 128:
        raise validation(field, "must be 1-128 characters of A-Z, a-z, 0-9, '.', '_' or '-'", "invalid_worker_id")
    return w


def check_hostname(h: str, field: str = "hostname") -> str:
    if not all(c.isalnum() or c in ".-_" for c in h) or h[0] in ".-" or h[-1] in ".-":
        raise validation(field, "Hostname contains invalid characters", "invalid_hostname")
    return h


_QUERY_INT = re.compile(r"[+-]?[0-9]+")
I64 = (-(2**63), 2**63 - 1)


def query_int(raw: str, lo: int = I64[0], hi: int = I64[1]) -> int | None:
    """A query-string integer as the server's deserializer reads one into its type (`lo`..`hi`, a signed
    64-bit integer by default): ASCII digits with an optional sign, nothing else (no `_`, no spaces, no
    other scripts' digits, which Python's int() takes); None when it is not one."""
    if not _QUERY_INT.fullmatch(raw) or len(raw) > 21:
        return None
    v = int(raw)
    return v if lo <= v <= hi else None

