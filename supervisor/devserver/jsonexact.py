"""JSON text <-> values with integers kept exact: orjson on the fast path, the stdlib where orjson can't.

orjson's real behaviour (3.x): `loads` silently turns an integer outside [-2**63, 2**64 - 1] into a
float (and refuses one beyond the double range as "infinity"); `dumps` raises on an int outside that
range and on nesting deeper than 254. So:

- `loads` uses orjson alone when the text has no run of 19 or more digits (every integer of 18
  digits fits 64 bits: exact). Otherwise orjson still checks the syntax (UTF-8, no NaN/Infinity, no
  lone surrogates, no leading zeros) on a copy with each long digit run replaced by `0`, and the
  stdlib parses the original, whose ints are exact; a float that overflows to infinity is refused.
- `dumps` / `dumps_bytes` use orjson and fall back to the stdlib (compact, UTF-8, NaN refused) only
  when orjson raises.

Errors are ValueError (orjson.JSONDecodeError is one), with orjson's or the stdlib's message.
Integers are bounded only by Python's int/str conversion limit (sys.get_int_max_str_digits, 4300).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"[0-9]{19,}")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of the double range")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _exact_loads(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"), parse_float=_finite, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def loads(data: bytes | str) -> Any:
    """Parse strict JSON; integers of any size come back as exact ints. Raises ValueError."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if _LONG_DIGITS.search(data) is None:
        return orjson.loads(data)
    orjson.loads(_LONG_DIGITS.sub(b"0", data))  # syntax check: raises orjson.JSONDecodeError
    return _exact_loads(data)


def dumps(value: object) -> str:
    """Compact JSON text of a JSON value (exact big ints); raises ValueError/TypeError if it has none."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps_bytes(value: object) -> bytes:
    """`dumps` as UTF-8 bytes; orjson.Fragment values are supported on orjson's path only."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
