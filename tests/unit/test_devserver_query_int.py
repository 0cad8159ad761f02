"""The one reader of integer query parameters the dev server's routes share (handlers.query_int): absent or
empty gives the default, junk and huge values are refused with the route's error, clamped values fit SQLite."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from supervisor.devserver.errors import HttpError
from supervisor.devserver.handlers import I64, U32, query_int

pytestmark = pytest.mark.timeout(10)


def q(raw: str | None):
    return SimpleNamespace(query={} if raw is None else {"n": [raw]})


@pytest.mark.parametrize("raw,want", [(None, 7), ("", 7), ("0", 0), ("-5", 0), ("42", 42), ("+42", 42), ("99999", 100),
                                      (str(2**63 - 1), 100)])
def test_a_clamped_parameter(raw, want):
    """A leading + is a sign, as the server's integer parser reads it (`%2B1` in a URL; a bare + is a space)."""
    assert query_int(q(raw), "n", 7, 0, 100, I64) == want


@pytest.mark.parametrize("raw", ["x", "1e3", "++1", " 1", "1_000", "٣", str(2**63), "9" * 20, "--1"])
def test_junk_or_too_big_for_the_servers_type_is_its_400(raw):
    with pytest.raises(HttpError) as info:
        query_int(q(raw), "n", 7, 0, 100, I64)
    assert info.value.status == 400 and info.value.body["code"] == "BAD_REQUEST"
    assert info.value.body["message"] == "Failed to deserialize query string: n: invalid digit found in string"


def test_an_unsigned_type_refuses_a_negative():
    with pytest.raises(HttpError):
        query_int(q("-1"), "n", 7, 0, 100, U32)
    assert query_int(q(str(2**32 - 1)), "n", 7, 0, 500, U32) == 500


@pytest.mark.parametrize("raw,ok", [("5", True), ("0", False), ("101", False), ("9" * 30, False), ("x", False)])
def test_a_checked_parameter_is_refused_outside_its_range(raw, ok):
    if ok:
        assert query_int(q(raw), "n", 1, 1, 100) == 5
        return
    with pytest.raises(HttpError) as info:
        query_int(q(raw), "n", 1, 1, 100)
    assert info.value.body["code"] == "VALIDATION_ERROR"
