"""Request validation with the contract's error shapes.

Absent required field -> 422 missing_field; wrong JSON type -> 422 invalid_type;
a value of the right type that breaks a rule -> 400 VALIDATION_ERROR. JSON null
counts as absent for optional fields.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from .errors import field_hint, invalid_type, missing_field, validation

_ASCII_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_MISSING = object()


def _queue_chars_ok(name: str) -> bool:
    return all(c.isalnum() or c in "-_." for c in name)


def parse_time(field: str, value) -> float:
    """RFC 3339 string -> epoch seconds (naive values are UTC)."""
    if not isinstance(value, str):
        raise invalid_type(field, "an RFC 3339 date-time string")
    try:
        dt = datetime.fromisoformat(value.strip().replace("z", "Z"))
    except ValueError:
        raise validation(field, "must be an RFC 3339 date-time", "invalid_datetime") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


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
    if not q or len(q) > 100:
        raise validation(field, "length must be between 1 and 100", "length")
    if not _queue_chars_ok(q) or q[0] in ".-":
        raise validation(field, "Queue name contains invalid characters", "invalid_queue_name")
    return q


def check_worker_id(w: str, field: str = "worker_id") -> str:
    if not _ASCII_ID.match(w) or len(w) > 128:
        raise validation(field, "must be 1-128 characters of A-Z, a-z, 0-9, '.', '_' or '-'", "invalid_worker_id")
    return w


def check_hostname(h: str, field: str = "hostname") -> str:
    if not all(c.isalnum() or c in ".-_" for c in h) or h[0] in ".-" or h[-1] in ".-":
        raise validation(field, "Hostname contains invalid characters", "invalid_hostname")
    return h
