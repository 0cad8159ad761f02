"""The optional TOML config file (`--config PATH` / SPOOLED_CONFIG): the same keys as the flags, precedence
flag > variable > file > default, and any mistake in it is one line naming the key and the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import exitcodes
from supervisor.config import OPTIONS, ConfigError, load_config

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())  # wherever tests/ nests it
KEY = "sp_test_0123456789abcdef"
BASE = {"SPOOLED_API_KEY": KEY, "SPOOLED_HANDLER": "m:f"}


def write(tmp_path: Path, text: str, name: str = "supervisor.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def one_line_error(argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(argv, env)
    text = str(err.value)
    assert "\n" not in text and text
    return text


def test_every_setting_is_read_from_the_file_under_its_flag_name(tmp_path):
    path = write(tmp_path, """
queue = ["images", "thumbs"]
procs = 3
lease = 60
drain-timeout = 12.5
max-memory-per-child = 512
log-format = "text"
log-level = "debug"
prefetch = "auto"
max-rps = 40
until-empty = true
share-api-key = false
""")
    cfg = load_config(["--config", path], BASE)
    assert cfg.queues == ("images", "thumbs") and cfg.first_queue == "images"
    assert (cfg.procs, cfg.lease, cfg.drain_timeout, cfg.max_memory_per_child_mb) == (3, 60, 12.5, 512)
    assert (cfg.log_format, cfg.log_level, cfg.prefetch, cfg.max_rps) == ("text", "DEBUG", None, 40.0)
    assert cfg.until_empty is True and cfg.share_api_key is False
    assert cfg.procs_source == f"procs=3 from procs in {path}"


def test_a_queue_list_may_also_be_written_as_the_flag_takes_it(tmp_path):
    path = write(tmp_path, 'queue = "a,b"\n')
    assert load_config(["--config", path], BASE).queues == ("a", "b")


def test_precedence_is_flag_then_variable_then_file_then_default(tmp_path):
    path = write(tmp_path, "procs = 2\nlease = 45\nkill-grace = 7\n")
    env = {**BASE, "SPOOLED_QUEUE": "q", "SPOOLED_PROCS": "3", "SPOOLED_LEASE": "50"}
    cfg = load_config(["--config", path, "--procs", "4"], env)
    assert (cfg.procs, cfg.lease, cfg.kill_grace, cfg.api_timeout) == (4, 50, 7.0, 10.0)
    cfg = load_config(["--config", path], env)
    assert (cfg.procs, cfg.procs_source) == (3, "procs=3 from SPOOLED_PROCS")
    cfg = load_config(["--config", path], {**env, "SPOOLED_PROCS": ""})  # an empty variable is unset
    assert (cfg.procs, cfg.lease) == (2, 50)


def test_a_switch_on_the_command_line_beats_false_in_the_file(tmp_path):
    path = write(tmp_path, "until-empty = false\nallow-insecure-http = false\n")
    cfg = load_config(["--config", path, "--until-empty"], {**BASE, "SPOOLED_QUEUE": "q"})
    assert cfg.until_empty is True and cfg.allow_insecure_http is False


def test_the_variable_names_the_file_and_the_flag_beats_the_variable(tmp_path):
    from_env = write(tmp_path, "procs = 5\n", "env.toml")
    from_flag = write(tmp_path, "procs = 6\n", "flag.toml")
    env = {**BASE, "SPOOLED_QUEUE": "q", "SPOOLED_CONFIG": from_env}
    assert load_config([], env).procs == 5
    assert load_config(["--config", from_flag], env).procs == 6
    assert load_config(["--procs", "1"], {**env, "SPOOLED_CONFIG": ""}).procs_source == "procs=1 from --procs"


def test_an_unknown_key_names_the_key_and_the_file(tmp_path):
    path = write(tmp_path, "procs = 2\nworkers = 4\n")
    assert one_line_error(["--config", path], BASE).startswith(f"unknown key workers in {path} (")


def test_a_key_spelt_with_underscores_is_refused_with_the_right_spelling(tmp_path):
    path = write(tmp_path, "max_memory_per_child = 512\n")
    assert one_line_error(["--config", path], BASE) == (
        f"unknown key max_memory_per_child in {path} (did you mean max-memory-per-child?)")


def test_the_key_itself_is_not_accepted_in_the_file_and_is_not_shown(tmp_path):
    path = write(tmp_path, f'api-key = "{KEY}"\n')
    text = one_line_error(["--config", path], BASE)
    assert text.startswith(f"api-key is not accepted in {path}") and KEY not in text


@pytest.mark.parametrize("line,shown", [
    ("procs = 0", "procs in {path} must be between 1 and 1000 (a whole number), got 0"),
    ('procs = "many"', "procs in {path} must be between 1 and 1000 (a whole number), got many"),
    ("lease = 2.5", "lease in {path} must be between 5 and 3600 (a whole number), got 2.5"),
    ("lease = true", "lease in {path} must be between 5 and 3600 (a whole number), got true"),
    ('until-empty = "maybe"', "until-empty in {path} must be 1/true/yes/on or 0/false/no/off (any case), got maybe"),
    ('log-format = "xml"', "log-format in {path} must be auto, json or text, got xml"),
    ('queue = [".hidden"]', "queue in {path} must be queue names separated by commas"),
    ("poll-interval = inf", "poll-interval in {path} must be between 0.05 and 300, got inf"),
    ("procs = [1, 2]", "procs in {path} must be a string, a number, true/false or a list of names, got list"),
    ("[procs]\nn = 1", "procs in {path} must be a string, a number, true/false or a list of names, got dict"),
])
def test_a_bad_value_names_the_key_and_the_file(tmp_path, line, shown):
    path = write(tmp_path, line + "\n")
    assert one_line_error(["--config", path], BASE).startswith(shown.format(path=path))


def test_a_file_that_is_missing_or_not_toml_is_one_line_naming_it(tmp_path):
    missing = str(tmp_path / "nope.toml")
    assert one_line_error(["--config", missing], BASE) == f"cannot read --config {missing}: No such file or directory"
    assert one_line_error([], {**BASE, "SPOOLED_CONFIG": missing}).startswith(f"cannot read SPOOLED_CONFIG {missing}")
    broken = write(tmp_path, "procs = = 2\n[[\n")
    assert one_line_error(["--config", broken], BASE).startswith(f"--config {broken} is not valid TOML: ")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"procs = \xff\n")
    assert "is not valid TOML" in one_line_error(["--config", str(binary)], BASE)


def test_the_file_errors_for_a_key_file_and_ca_bundle_name_the_key(tmp_path):
    path = write(tmp_path, f'api-key-file = "{tmp_path / "no-key"}"\n')
    env = {k: v for k, v in BASE.items() if k != "SPOOLED_API_KEY"}
    assert one_line_error(["--config", path], env).startswith(f"cannot read api-key-file in {path} ")
    path = write(tmp_path, f'ca-bundle = "{tmp_path / "no-ca.pem"}"\n')
    assert one_line_error(["--config", path], BASE).startswith(f"ca-bundle in {path} ")


def test_every_flag_is_a_key_and_the_help_names_the_file():
    out = subprocess.run([sys.executable, "-m", "supervisor", "run", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    help_text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "--config PATH" in help_text and "(SPOOLED_CONFIG)" in help_text
    assert all(opt.flag.startswith("--") for opt in OPTIONS)


def test_the_daemon_exits_2_with_one_line_for_a_bad_file(tmp_path):
    path = write(tmp_path, "procs = 2\nprocz = 3\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")}
    out = subprocess.run([sys.executable, "-m", "supervisor", "--config", path], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**clean, **BASE, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == exitcodes.CONFIG
    assert out.stderr == f"error: unknown key procz in {path} (did you mean procs?)\n"
