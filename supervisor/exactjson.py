"""JSON that keeps every integer exact: orjson on the fast path, the standard library where orjson can't.

orjson (3.x) reads an integer outside [-2**63, 2**64-1] as a float, silently, and refuses to write
one (TypeError "Integer exceeds 64-bit range"); it also writes NaN and Infinity as `null`. Spooled's
REST API keeps big integers exact, so:

- `loads` looks for a run of 19 digits (the shortest integer that can overflow: -9223372036854775809;
  one `bytes.translate` and a substring search, ~0.4 us per 300 bytes where a regex takes 2-3 us) and
  only then parses with `json`, which reads integers exactly; orjson still checks the syntax on a copy
  with each long digit run replaced by `0` (so both paths accept exactly the same texts: UTF-8, no
  NaN/Infinity, no lone surrogates), and a float that overflows to infinity is refused. A run inside
  a string (a numeric id) or a 19-digit integer that would have fitted takes the slow path too, with
  the same result. Integers are bounded by Python's int/str conversion limit (4300 digits).
- `dumps` tries orjson and falls back to `json` when orjson raises (big integers); orjson-only types
  (datetime, dataclass, UUID, Fragment ...) are handed to orjson one value at a time on that path.
- `dumps_strict` is for values a user's code produced (a handler's result): NaN, Infinity, a set, an
  object JSON has no form for, a non-string key or a cycle raise `NotJSON` naming the value and where it is.

Neither fallback accepts NaN/Infinity, so both paths take and give the same JSON.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

# Every digit becomes "0", everything else "."; a run of 19 zeros then marks an integer orjson may turn
# into a float.
_DIGITS_TO_ZERO = bytes(48 if 48 <= i <= 57 else 46 for i in range(256))
_WIDE_INT = b"0" * 19
_NOT_JSON_CONSTANT = "NaN, Infinity and -Infinity are not JSON"
_LONG_DIGITS = re.compile(rb"[0-9]{19,}")


class NotJSON(ValueError):
    """The value has no exact JSON form; the message names it and where it is."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name}: {_NOT_JSON_CONSTANT}")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text; integers of any size come back as `int`. Raises ValueError on bad JSON
    (orjson.JSONDecodeError is one)."""
    raw = data.encode() if isinstance(data, str) else data
    if _WIDE_INT not in (raw if isinstance(raw, bytes | bytearray) else bytes(raw)).translate(_DIGITS_TO_ZERO):
        return orjson.loads(raw)
    raw = bytes(raw)
    orjson.loads(_LONG_DIGITS.sub(b"0", raw))  # the syntax check both paths share (raises JSONDecodeError)
    try:
        return json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of the double range")
    return value


def _orjson_value(value: Any) -> Any:
    """`json.dumps` default: a type only orjson knows (datetime, dataclass, Fragment ...) through orjson."""
    return loads(orjson.dumps(value))


def _stdlib_dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                      default=_orjson_value).encode()


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, integers of any size exact. Raises TypeError/ValueError if it can't be encoded."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        error = exc
    try:
        return _stdlib_dumps(value)
    except (TypeError, ValueError, RecursionError):
        raise error from None


def dumps_strict(value: Any, name: str = "value") -> bytes:
    """Like `dumps`, but a value with no JSON form raises NotJSON, e.g.
    "float('nan') at result['x'] is not valid JSON" (orjson alone would write NaN as null)."""
    return dumps_strict_wide(value, name)[0]


def dumps_strict_wide(value: Any, name: str = "value") -> tuple[bytes, bool]:
    """`dumps_strict`, and whether the JSON may hold an integer past 64 bits (False: orjson wrote it, and
    reads it back exactly)."""
    try:
        data: bytes | None = orjson.dumps(value)
    except TypeError:
        data = None
    if data is not None and b"null" not in data:  # no NaN/Infinity can hide in it: the fast path
        return data, False
    problem = find_not_json(value, name, floats_only=data is not None)
    if problem:
        raise NotJSON(problem)
    if data is not None:
        return data, False
    try:
        return _stdlib_dumps(value), True  # integers over 64 bits
    except RecursionError:
        raise NotJSON(f"{name} is nested too deeply to encode as JSON") from None
    except (TypeError, ValueError) as exc:
        raise NotJSON(f"{name} is not valid JSON: {exc}") from None


def describe(value: Any) -> str:
    if isinstance(value, float):
        return f"float('{value!r}')"
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _bad_leaf(value: Any, floats_only: bool) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if floats_only or value is None or isinstance(value, str | int):
        return False
    try:
        orjson.dumps(value)
    except TypeError as exc:
        return "64-bit" not in str(exc)
    return False


def _render(name: str, node: tuple | None) -> str:
    keys = []
    while node is not None:
        node, key = node
        keys.append(f"[{key!r}]")
    return name + "".join(reversed(keys))


def find_not_json(value: Any, name: str = "value", floats_only: bool = False) -> str | None:
    """The first part of `value` with no JSON form, as a sentence, or None. Walks without recursion and
    visits a shared container once (a cycle is left to the encoder); `floats_only` looks only for
    NaN/Infinity (for when orjson accepted everything else)."""
    stack: list[tuple[Any, tuple | None]] = [(value, None)]
    seen: set[int] = set()
    while stack:
        item, node = stack.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                for key, sub in item.items():
                    if not isinstance(key, str) and not floats_only:
                        where = _render(name, node)
                        return f"the key {describe(key)} in {where} is not a string, which JSON keys must be"
                    stack.append((sub, (node, key)))
            else:
                stack.extend((sub, (node, i)) for i, sub in enumerate(item))
        elif _bad_leaf(item, floats_only):
            return f"{describe(item)} at {_render(name, node)} is not valid JSON"
    return None
