"""google.protobuf.Struct values as plain JSON data, read field by field: protobuf's json_format walks
them by reflection, several times the cost per value (a map's items() is the slow generic view too, so
maps are read by key)."""

from __future__ import annotations

import math
from typing import Any

EXACT_INT = 2 ** 53  # doubles hold every integer below this in size exactly


def plain(value: Any, ints: bool) -> Any:
    """A Value as JSON data. With `ints`, whole numbers below 2**53 in size come back as int (a Struct
    carries only doubles); without, numbers stay float, and NaN or an infinity raises ValueError (JSON
    has neither)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if ints:
            return int(number) if number.is_integer() and -EXACT_INT < number < EXACT_INT else number
        if math.isnan(number) or math.isinf(number):
            raise ValueError(f"a Struct number of {number} has no JSON form")
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        fields = value.struct_value.fields
        return {k: plain(fields[k], ints) for k in fields}
    if kind == "list_value":
        return [plain(v, ints) for v in value.list_value.values]
    return None  # null_value, or no kind set


def plain_struct(struct: Any, ints: bool) -> dict:
    """A Struct as a dict, its values as `plain` makes them."""
    fields = struct.fields
    return {k: plain(fields[k], ints) for k in fields}
