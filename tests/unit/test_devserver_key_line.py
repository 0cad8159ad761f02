"""The dev server's start line never shows a key it was given, however the flag is spelled: the source is
decided from the value, an abbreviated flag is refused (exit 2) without echoing what followed it, and the
daemon's own parsers take flags in full only."""

from __future__ import annotations

import pytest

from supervisor import config
from supervisor.devserver import cli

pytestmark = pytest.mark.timeout(10)

KEY = "sk_test_given_abcdefghijklmnop"


def test_the_source_is_decided_from_the_value():
    assert cli.key_source(None, {}) is None and cli.key_source("", {"SPOOLED_API_KEY": ""}) is None
    assert cli.key_source(KEY, {}) == "--api-key"
    assert cli.key_source(KEY, {"SPOOLED_API_KEY": KEY}) == "SPOOLED_API_KEY"
    assert cli.key_source(KEY, {"SPOOLED_DEV_API_KEY": KEY, "SPOOLED_API_KEY": "other"}) == "SPOOLED_DEV_API_KEY"
    line = cli.key_line(KEY, cli.key_source(KEY, {}))
    assert KEY not in line and line.endswith("...mnop")


@pytest.mark.parametrize("argv", [["--api", KEY], ["--api-k", KEY], [f"--api={KEY}"], ["--api-keyy", KEY]])
def test_an_abbreviated_or_misspelt_key_flag_is_refused_without_echoing_the_key(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and KEY not in err and "abcdefghijklmnop" not in err


def test_the_run_parser_takes_flags_in_full_only():
    with pytest.raises(config.ConfigError):
        config.build_parser({}).parse_args(["--proc", "2"])
    assert config.build_parser({}).parse_args(["--procs", "2"]).procs == "2"
