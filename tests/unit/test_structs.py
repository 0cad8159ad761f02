"""Struct values read field by field (supervisor.proto.structs) give what protobuf's json_format gives."""

from __future__ import annotations

import math

import pytest

json_format = pytest.importorskip("google.protobuf.json_format")
struct_pb2 = pytest.importorskip("google.protobuf.struct_pb2")

from supervisor.proto.structs import plain, plain_struct  # noqa: E402

pytestmark = pytest.mark.timeout(10)

DATA = {"n": 5, "f": 1.5, "big": 2 ** 60, "s": "<b>x</b>", "t": True, "none": None, "empty": {}, "xs": [],
        "deep": {"a": [1, {"b": [False, "c", -3]}], "e": -0.0}}


def test_without_ints_it_is_exactly_what_message_to_dict_gives():
    s = struct_pb2.Struct()
    s.update(DATA)
    mine, theirs = plain_struct(s, ints=False), json_format.MessageToDict(s)
    assert mine == theirs and repr(mine) == repr(theirs)  # the same types too: every number a float
    assert type(mine["n"]) is float and mine["deep"]["a"][1]["b"][2] == -3.0


def test_with_ints_whole_numbers_below_2_53_come_back_as_int():
    s = struct_pb2.Struct()
    s.update(DATA)
    got = plain_struct(s, ints=True)
    assert got["n"] == 5 and type(got["n"]) is int and type(got["deep"]["a"][1]["b"][2]) is int
    assert type(got["f"]) is float and type(got["big"]) is float  # 2**60: already rounded, left a float
    assert got["s"] == "<b>x</b>" and got["none"] is None and got["empty"] == {} and got["xs"] == []


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_number_json_cannot_hold_is_refused_without_ints(number):
    v = struct_pb2.Value(number_value=number)
    with pytest.raises(ValueError, match="no JSON form"):
        plain(v, ints=False)
    got = plain(v, ints=True)  # (the daemon's side takes what the server sent)
    assert math.isnan(got) if math.isnan(number) else got == number


def test_a_value_with_no_kind_is_none():
    assert plain(struct_pb2.Value(), ints=False) is None and plain(struct_pb2.Value(), ints=True) is None
