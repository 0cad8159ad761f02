"""Bad settings from every source a real `python -m supervisor run` reads: each exits 2 with one line naming
the setting (never a traceback, never the key), and the largest values accepted still drain cleanly."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from conftest import PY, Daemon

KEY = "sp_test_abcdefghijklmnop"
BASE = ["-m", "supervisor", "run", "--queue", "q", "--api-url", "http://127.0.0.1:9"]


def run_bad(tmp_path, args: list[str], env: dict[str, str | None]) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_") and k != "CREDENTIALS_DIRECTORY"}
    environ["SPOOLED_API_KEY"] = KEY
    environ["SPOOLED_HANDLER"] = "supervisor.demo_handlers:misbehave"
    for k, v in env.items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v
    proc = subprocess.run([PY, *BASE, *args], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          errors="replace", timeout=30)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out[-2000:]
    assert "\n" not in out and "Traceback" not in out and KEY not in out, out[-2000:]
    return out


def write(tmp_path, name: str, data: bytes | str) -> str:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return str(path)


CASES = {
    "a 5,000-digit integer in the config file": (
        lambda p: (["--config", write(p, "big.toml", "procs = " + "9" * 5000 + "\n")], {}),
        "number too long to read"),
    "a 4,000-digit integer in the config file": (
        lambda p: (["--config", write(p, "big.toml", "max-jobs-per-child = " + "9" * 4000 + "\n")], {}),
        "max-jobs-per-child in "),
    "a 4,000-digit integer in a variable": (
        lambda p: ([], {"SPOOLED_MAX_JOBS_PER_CHILD": "9" * 4000}), "SPOOLED_MAX_JOBS_PER_CHILD must be between"),
    "a NUL in a path in the config file": (
        lambda p: (["--config", write(p, "nul.toml", 'api-key-file = "/run/a\\u0000b"\n')], {}),
        "api-key-file in "),
    "a NUL in the health host": (
        lambda p: (["--config", write(p, "nul.toml", 'health-host = "0.0.0.0\\u0000"\nhealth-port = 0\n')], {}),
        "health-host in "),
    "a NUL in the handler": (
        lambda p: (["--config", write(p, "nul.toml", 'handler = "a\\u0000b:c"\n')], {"SPOOLED_HANDLER": None}),
        "handler in "),
    "a key file in UTF-16": (
        lambda p: (["--api-key-file", write(p, "key", KEY.encode("utf-16"))], {}), "is UTF-16 text"),
    "a key file in UTF-16 without a byte-order mark": (
        lambda p: (["--api-key-file", write(p, "key", KEY.encode("utf-16-le"))], {}), "holds NUL bytes (UTF-16"),
    "a key file not in UTF-8": (
        lambda p: (["--api-key-file", write(p, "key", b"sp_test_abc\xe9defghijkl")], {}),
        "is not UTF-8 text: byte 0xe9 at offset 11"),
    "a non-Latin-1 key in the variable": (
        lambda p: ([], {"SPOOLED_API_KEY": "sp_test_abc\u20acdefghijkl"}), "SPOOLED_API_KEY holds a character"),
    "a key credential in UTF-16": (
        lambda p: ([], {"SPOOLED_API_KEY": None, "CREDENTIALS_DIRECTORY": os.path.dirname(
            write(p, "spooled-api-key", KEY.encode("utf-16")))}), "the systemd credential spooled-api-key is UTF-16"),
    "a key file that is not a key": (
        lambda p: (["--api-key-file", write(p, "key", b"x" * 100_000)], {}), "does not hold an API key"),
    "kill-grace of 1e7 s": (lambda p: (["--kill-grace", "1e7"], {}), "--kill-grace must be between 0 and 3600"),
    "drain-timeout of 1e7 s": (
        lambda p: ([], {"SPOOLED_DRAIN_TIMEOUT": "1e7"}), "SPOOLED_DRAIN_TIMEOUT must be between 0 and 86400"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_setting_exits_2_with_one_line_naming_it(tmp_path, case):
    make, expected = CASES[case]
    args, env = make(tmp_path)
    out = run_bad(tmp_path, args, env)
    assert expected in out, out


@pytest.mark.timeout(60)
def test_the_longest_drain_and_grace_accepted_drain_without_a_loop_error(dev_server):
    d = Daemon(dev_server, "q-long-drain", procs=1, worker_id="w-long-drain",
               args=["--drain-timeout", "86400", "--kill-grace", "3600", "--ready-api-silence", "86400"]).start()
    try:
        d.wait_ready()
        d.signal(signal.SIGTERM)
        assert d.wait(30) == 0
        assert not d.events("unexpected error in the main loop; carrying on")
        assert not [line for line in d.out.lines if "OverflowError" in line]
    finally:
        d.stop()
