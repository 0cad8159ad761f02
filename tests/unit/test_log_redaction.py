"""The API key never leaves in a log line, whatever carries it: message, arguments, fields of any type, tracebacks."""

from __future__ import annotations

import io
import json
import logging

import pytest

from supervisor.ops.logs import log_event, setup_logging

KEY = "sp_test_Zx9QwErTy0123456789"  # a made-up key


class Carrier:
    """A non-string field whose str() holds the key."""

    def __str__(self) -> str:
        return f"Carrier(token={KEY})"


class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def capture():
    """setup_logging into an in-memory stream; the root logger is restored afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def start(fmt: str, secret: str = KEY) -> Stream:
        stream = Stream(tty=(fmt == "text"))
        setup_logging("auto", "DEBUG", secret=secret, stream=stream)
        return stream
    yield start
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def leaky_call() -> None:
    token = KEY
    raise RuntimeError(f"the server rejected {token}")


def log_everything(log: logging.Logger) -> None:
    log_event(log, logging.WARNING, f"claim failed for {KEY}", headers={"Authorization": f"Bearer {KEY}",
              "nested": {"deeper": [KEY, {"k": KEY}]}}, args=[1, KEY], obj=Carrier(), raw=KEY.encode(), n=7)
    log.info("plain %s and %r", KEY, {"key": KEY})
    log.info("via extra", extra={"token": KEY, "blob": {"a": KEY}})
    try:
        leaky_call()
    except RuntimeError:
        log.exception("request failed")
    log.info("stack", stack_info=True, extra={"why": KEY})


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_key_is_scrubbed_from_every_part_of_every_line(capture, fmt):
    stream = capture(fmt)
    log_everything(logging.getLogger("supervisor.test"))
    out = stream.getvalue()
    assert KEY not in out and KEY[8:] not in out
    assert out.count("***") >= 12
    assert "RuntimeError: the server rejected ***" in out
    assert "Traceback (most recent call last)" in out and "leaky_call" in out
    if fmt == "json":
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        first = lines[0]
        assert first["msg"] == "claim failed for ***" and first["n"] == 7
        assert first["headers"] == {"Authorization": "Bearer ***", "nested": {"deeper": ["***", {"k": "***"}]}}
        assert first["obj"] == "Carrier(token=***)" and first["args"] == [1, "***"]
        exc_line = next(entry for entry in lines if entry["msg"] == "request failed")
        assert exc_line["exc"].endswith("RuntimeError: the server rejected ***")
    else:
        assert "headers={'Authorization': 'Bearer ***', 'nested': {'deeper': ['***', {'k': '***'}]}}" in out
        assert "obj=Carrier(token=***)" in out and "n=7" in out


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_key_that_looks_like_a_number_is_scrubbed_from_numeric_fields(capture, fmt):
    numeric = "90210736451122"
    stream = capture(fmt, secret=numeric)
    log_event(logging.getLogger("supervisor.test"), logging.INFO, "count", total=int(numeric), ratio=1.5,
              big=int(numeric) * 10**30)
    out = stream.getvalue()
    assert numeric not in out and "***" in out and "1.5" in out


def test_keys_with_characters_json_escapes_are_scrubbed_in_escaped_form(capture):
    odd = 'sp_test_"quoted"\\slash'
    stream = capture("json", secret=odd)
    log_event(logging.getLogger("supervisor.test"), logging.INFO, "odd", value=odd, nested={"v": [odd]})
    out = stream.getvalue()
    assert odd not in out and json.dumps(odd)[1:-1] not in out
    line = json.loads(out)
    assert line["value"] == "***" and line["nested"] == {"v": ["***"]}


def test_an_unformattable_record_is_one_scrubbed_line_not_a_dump(capture, capsys):
    stream = capture("text")
    logging.getLogger("supervisor.test").info("two args %s %s for " + KEY, "only-one")
    out = stream.getvalue()
    assert KEY not in out and "could not be formatted" in out and len(out.splitlines()) == 1
    assert KEY not in capsys.readouterr().err


def test_without_a_secret_nothing_is_replaced(capture):
    stream = capture("json", secret="")
    log_event(logging.getLogger("supervisor.test"), logging.INFO, "hello", value="***plain")
    assert json.loads(stream.getvalue())["value"] == "***plain"
