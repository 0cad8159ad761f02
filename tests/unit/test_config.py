"""Configuration: every variable is checked exactly like its flag, and a bad value is one line naming its source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import exitcodes
from supervisor.config import OPTIONS, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
KEY = "sp_test_0123456789abcdef"
BASE = {"SPOOLED_API_KEY": KEY, "SPOOLED_QUEUE": "q", "SPOOLED_HANDLER": "m:f"}

# One bad value per variable the daemon reads, and a word the error must carry (the allowed values).
BAD_VALUES = {
    "SPOOLED_QUEUE": (".hidden", "queue name"),
    "SPOOLED_HANDLER": ("nocolon", "package.module:function"),
    "SPOOLED_PROCS": ("abc", "between 1 and 1000"),
    "SPOOLED_API_URL": ("ftp://x", "http(s) URL"),
    "SPOOLED_API_KEY_FILE": (" ", "empty"),
    "SPOOLED_WORKER_ID": ("bad id!", "1-128 characters"),
    "SPOOLED_LEASE": ("4", "between 5 and 3600"),
    "SPOOLED_DRAIN_TIMEOUT": ("1e7", "between 0 and 86400"),
    "SPOOLED_POLL_INTERVAL": ("0.01", "between 0.05 and 300"),
    "SPOOLED_WAKE": ("push", "events or poll"),
    "SPOOLED_MAX_JOBS_PER_CHILD": ("9" * 4000, "between 0 and 1000000000"),
    "SPOOLED_MAX_MEMORY_PER_CHILD": ("-5", "between 0 and 16777216"),
    "SPOOLED_PRELOAD": ("maybe", "1/true/yes/on or 0/false/no/off"),
    "SPOOLED_WATCH": ("maybe", "1/true/yes/on or 0/false/no/off"),
    "SPOOLED_WATCH_PATH": ("/no/such/folder", "does not exist"),
    "SPOOLED_MEMORY_HIGH": ("101%", "between 1% and 100%"),
    "SPOOLED_MEMORY_MAX": ("lots", "whole number of MiB"),
    "SPOOLED_KILL_GRACE": ("1e7", "between 0 and 3600"),
    "SPOOLED_CHILD_INIT": ("nocolon", "package.module:function"),
    "SPOOLED_CHILD_EXIT_GRACE": ("301", "between 0 and 300"),
    "SPOOLED_MAX_RESULT_BYTES": ("1000", "between 1024 and 1073741824"),
    "SPOOLED_API_TIMEOUT": ("121", "between 0.5 and 120"),
    "SPOOLED_CA_BUNDLE": ("/nonexistent/ca.pem", "not a readable file"),
    "SPOOLED_ALLOW_INSECURE_HTTP": ("TRUEISH", "1/true/yes/on or 0/false/no/off"),
    "SPOOLED_HEALTH_PORT": ("65536", "between 0 and 65535"),
    "SPOOLED_HEALTH_HOST": ("  ", "empty"),
    "SPOOLED_READY_API_SILENCE": ("1e7", "above 0 and at most 86400"),
    "SPOOLED_K8S_DELETION_COST": ("maybe", "1/true/yes/on or 0/false/no/off"),
    "SPOOLED_LOG_FORMAT": ("xml", "auto, json or text"),
    "SPOOLED_LOG_LEVEL": ("LOUD", "DEBUG, INFO, WARNING or ERROR"),
    "SPOOLED_CHILD_LOGGING": ("root", "daemon or module"),
    "SPOOLED_PREFETCH": ("1001", "auto or between 0 and 1000"),
    "SPOOLED_MAX_RPS": ("1e300", "above 0 and at most 1000000"),
    "SPOOLED_TRANSPORT": ("soap", "rest or grpc"),
    "SPOOLED_GRPC_CLIENT": ("grpc-go", "wire or grpcio"),
    "SPOOLED_GRPC_URL": ("grpc.example.com", "HOST:PORT"),
    "SPOOLED_UNTIL_EMPTY": ("2", "1/true/yes/on or 0/false/no/off"),
    "SPOOLED_SHARE_API_KEY": ("sure", "1/true/yes/on or 0/false/no/off"),
}


def one_line_error(argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(argv, env)
    text = str(err.value)
    assert "\n" not in text and text
    return text


def test_every_option_has_a_bad_value_case():
    assert {opt.env for opt in OPTIONS} == set(BAD_VALUES)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bad_environment_value_names_the_variable(name):
    value, allowed = BAD_VALUES[name]
    text = one_line_error([], {**BASE, name: value})
    assert text.startswith(name + " ") and allowed in text
    flag = next(opt.flag for opt in OPTIONS if opt.env == name)
    assert flag + " " not in text  # the user set the variable, so the error must not send them to the flag


@pytest.mark.parametrize("name", sorted(n for n in BAD_VALUES if n not in ("SPOOLED_ALLOW_INSECURE_HTTP",
                                                                           "SPOOLED_UNTIL_EMPTY",
                                                                           "SPOOLED_K8S_DELETION_COST",
                                                                           "SPOOLED_SHARE_API_KEY",
                                                                           "SPOOLED_PRELOAD",
                                                                           "SPOOLED_WATCH")))
def test_the_same_bad_value_as_a_flag_names_the_flag(name):
    value, allowed = BAD_VALUES[name]
    flag = next(opt.flag for opt in OPTIONS if opt.env == name)
    text = one_line_error([f"{flag}={value}"], BASE)
    assert text.startswith(flag + " ") and allowed in text


def test_key_sources_name_what_the_user_set(tmp_path):
    missing = str(tmp_path / "no-such-key")
    assert one_line_error([], {**BASE, "SPOOLED_API_KEY_FILE": missing}).startswith(
        f"cannot read SPOOLED_API_KEY_FILE {missing}: ")
    assert one_line_error(["--api-key-file", missing], BASE).startswith(f"cannot read --api-key-file {missing}: ")
    for bad in ("sp_x", "sp_test_with space inside"):
        text = one_line_error([], {**BASE, "SPOOLED_API_KEY": bad})
        assert "SPOOLED_API_KEY" in text and bad not in text


@pytest.mark.parametrize("value", ["1\n2'x", "caf\u00e9\t\\", "bad\udcffbyte"])
def test_a_value_with_control_characters_is_shown_on_one_line_as_bash_would_read_it(value):
    text = one_line_error([], {**BASE, "SPOOLED_PROCS": value})
    shown = text.rsplit("got ", 1)[1]
    assert shown.startswith("$'") and shown.isascii()
    typed = subprocess.run(["bash", "-c", "printf %s " + shown], capture_output=True)
    assert typed.stdout == value.encode("utf-8", "surrogateescape")  # the same bytes back, undecodable ones too


def test_a_long_path_is_shown_whole(tmp_path):
    missing = str(tmp_path / ("d" * 200) / "key")
    assert one_line_error([], {**BASE, "SPOOLED_API_KEY_FILE": missing}) == (
        f"cannot read SPOOLED_API_KEY_FILE {missing}: No such file or directory")


def test_a_flag_beats_its_variable_and_an_empty_variable_is_unset():
    env = {**BASE, "SPOOLED_PROCS": "abc", "SPOOLED_LOG_FORMAT": ""}
    cfg = load_config(["--procs", "3", "--log-format", "text"], env)
    assert cfg.procs == 3 and cfg.procs_source == "procs=3 from --procs" and cfg.log_format == "text"
    assert load_config([], {**BASE, "SPOOLED_PROCS": "4"}).procs_source == "procs=4 from SPOOLED_PROCS"


@pytest.mark.parametrize("text,expected", [(t, True) for t in ("1", "true", "TRUE", "Yes", "on", "ON")]
                         + [(t, False) for t in ("0", "false", "False", "NO", "off", "Off")])
def test_booleans_accept_every_spelling_in_any_case(text, expected):
    env = {**BASE, "SPOOLED_ALLOW_INSECURE_HTTP": text, "SPOOLED_UNTIL_EMPTY": text,
           "SPOOLED_API_URL": "http://10.0.0.1:8080"}
    if expected:
        cfg = load_config([], env)
        assert cfg.allow_insecure_http is True and cfg.until_empty is True
    else:
        assert "refusing plain http://" in one_line_error([], env)
        env["SPOOLED_API_URL"] = "http://127.0.0.1:1"
        cfg = load_config([], env)
        assert cfg.allow_insecure_http is False and cfg.until_empty is False


def test_switch_flags_set_true_over_a_false_variable():
    cfg = load_config(["--until-empty", "--allow-insecure-http"],
                      {**BASE, "SPOOLED_UNTIL_EMPTY": "off", "SPOOLED_ALLOW_INSECURE_HTTP": "0"})
    assert cfg.until_empty and cfg.allow_insecure_http


def test_new_fields_defaults():
    cfg = load_config([], BASE)
    assert cfg.queues == ("q",) and cfg.first_queue == "q"
    assert cfg.prefetch is None and cfg.max_rps is None
    assert cfg.transport == "rest" and cfg.grpc_url == "grpc.spooled.cloud:443"
    assert cfg.until_empty is False
    assert cfg.procs >= 1 and cfg.procs_source.startswith(f"procs={cfg.procs} from ")
    assert cfg.log_level == "INFO" and cfg.log_format == "auto"


def test_several_queues_in_priority_order():
    cfg = load_config(["--queue", "emails, notifications,reports"], BASE)
    assert cfg.queues == ("emails", "notifications", "reports") and cfg.first_queue == "emails"
    assert "listed twice" in one_line_error(["--queue", "a,b,a"], BASE)
    assert "queue name" in one_line_error(["--queue", "a,,b"], BASE)
    assert one_line_error([], {**BASE, "SPOOLED_QUEUE": "a,-b"}).startswith("SPOOLED_QUEUE ")


def test_prefetch_max_rps_transport_values():
    env = {**BASE, "SPOOLED_PREFETCH": "0", "SPOOLED_MAX_RPS": "12.5", "SPOOLED_TRANSPORT": "GRPC",
           "SPOOLED_GRPC_URL": "[::1]:50051", "SPOOLED_API_URL": "http://[::1]:8787"}
    cfg = load_config([], env)
    assert (cfg.prefetch, cfg.max_rps, cfg.transport, cfg.grpc_url) == (0, 12.5, "grpc", "[::1]:50051")
    cfg = load_config(["--prefetch", "AUTO", "--prefetch", "1000"], BASE)
    assert cfg.prefetch == 1000
    assert load_config(["--prefetch", "auto", "--max-rps", "off"], env).prefetch is None
    assert load_config(["--max-rps", "off"], env).max_rps is None
    for bad in ("-1", "1e3", "inf", "many"):
        assert "--prefetch" in one_line_error(["--prefetch", bad], BASE)
    for bad in ("-2", "inf", "fast"):
        assert "--max-rps" in one_line_error([f"--max-rps={bad}"], BASE)
    for bad in ("host:0", "host:99999", "user@host:1", "host:1/path", ":443"):
        assert "HOST:PORT" in one_line_error(["--grpc-url", bad], BASE)


def test_grpc_transport_without_the_grpc_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` now raises ImportError
    text = one_line_error(["--transport", "grpc"], BASE)
    assert "pip install 'spooled-supervisor[grpc]'" in text
    assert load_config([], BASE).transport == "rest"  # REST needs no grpc


@pytest.mark.parametrize("argv,text", [
    (["--procs", "abc"], "--procs must be between 1 and 1000 (a whole number), got abc"),
    (["--procs"], "--procs: expected one argument"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--procs", "0"], "--procs must be between 1 and 1000 (a whole number), got 0"),
    (["--lease", "1 0"], "got '1 0'"),
])
def test_bad_flags_are_one_line(argv, text):
    assert text in one_line_error(argv, BASE)


def test_help_lists_every_option_with_its_variable():
    out = subprocess.run([sys.executable, "-m", "supervisor", "run", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0
    help_text = " ".join(out.stdout.split())
    for opt in OPTIONS:
        assert opt.flag in help_text and f"({opt.env})" in help_text, opt.flag


def run_cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")}
    return subprocess.run([sys.executable, "-m", "supervisor", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, "PYTHONDONTWRITEBYTECODE": "1", **env})


@pytest.mark.parametrize("argv,env,first", [
    (["--procs", "abc"], BASE, "error: --procs must be between 1 and 1000 (a whole number), got abc"),
    (["--bogus"], BASE, "error: unrecognized arguments: --bogus"),
    ([], {**BASE, "SPOOLED_LOG_FORMAT": "xml"}, "error: SPOOLED_LOG_FORMAT must be auto, json or text, got xml"),
    ([], {**BASE, "SPOOLED_ALLOW_INSECURE_HTTP": "TRUEISH"}, "error: SPOOLED_ALLOW_INSECURE_HTTP must be"),
])
def test_real_cli_exits_2_with_one_line_on_stderr(argv, env, first):
    out = run_cli(argv, env)
    assert out.returncode == exitcodes.CONFIG == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(first), out.stderr
    assert KEY not in out.stderr


@pytest.mark.parametrize("given, missing", [({"SPOOLED_GRPC_URL": "127.0.0.1:50051"}, "--api-url"),
                                            (["--grpc-url", "127.0.0.1:50051"], "--api-url"),
                                            ({"SPOOLED_API_URL": "http://127.0.0.1:8787"}, "--grpc-url")])
def test_grpc_with_one_endpoint_named_exits_2_asking_for_the_other(given, missing):
    """The key goes only to hosts the operator named, or to Spooled Cloud when nothing was named."""
    pytest.importorskip("grpc")
    argv = ["--transport", "grpc", *(given if isinstance(given, list) else [])]
    env = {**BASE, **(given if isinstance(given, dict) else {})}
    text = one_line_error(argv, env)
    assert missing in text and "Spooled Cloud" in text
    both = load_config(["--transport", "grpc"], {**env, "SPOOLED_API_URL": "http://127.0.0.1:8787",
                                                 "SPOOLED_GRPC_URL": "127.0.0.1:50051"})
    assert (both.api_url_source, both.grpc_url) == ("SPOOLED_API_URL", "127.0.0.1:50051")
    neither = load_config(["--transport", "grpc"], BASE)  # Spooled Cloud for both
    assert (neither.api_url_source, neither.api_url, neither.grpc_url) == (
        "default", "https://api.spooled.cloud", "grpc.spooled.cloud:443")
