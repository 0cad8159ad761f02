"""A key the dev server was given is never printed whole, however the flag was spelled (`--api-key KEY` or
`--api-key=KEY`; an abbreviation such as `--api-k` is refused, see tests/unit/test_devserver_key_line.py) or
whichever variable held it: its start line names the source and the last four characters. A key it made itself
is printed, as before."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import requests
from conftest import PY, ROOT, OutputPump, own, wait_until
from support.fake_keys import live_shaped

pytestmark = pytest.mark.timeout(60)

REAL = live_shaped("k" * 28 + "T9z4")


def start(db: str, args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, OutputPump, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")}
    proc = own(subprocess.Popen([PY, "-m", "supervisor", "dev-server", "--port", "0", "--db", db, *args], cwd=ROOT,
                                env={**clean, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True))
    out = OutputPump(proc.stdout)
    url = out.wait_for(r"listening on (http://127\.0\.0\.1:\d+)").group(1)
    return proc, out, url


def stop(proc: subprocess.Popen, out: OutputPump) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    out.drain()
    return out.text()


@pytest.mark.parametrize(("args", "env", "source"), [
    (["--api-key=" + REAL], {}, "--api-key"),
    (["--api-key", REAL], {"SPOOLED_API_KEY": live_shaped("o" * 28 + "0ther")}, "--api-key"),  # the flag wins
    ([], {"SPOOLED_DEV_API_KEY": REAL}, "SPOOLED_DEV_API_KEY"),
    ([], {"SPOOLED_API_KEY": REAL}, "SPOOLED_API_KEY"),
])
def test_a_given_key_is_named_by_its_source_and_last_four(tmp_path, args, env, source):
    proc, out, url = start(str(tmp_path / "k.db"), args, env)
    try:
        ok = wait_until(lambda: requests.get(url + "/api/v1/jobs/stats", timeout=2,
                                             headers={"Authorization": f"Bearer {REAL}"}).status_code == 200)
        assert ok
    finally:
        text = stop(proc, out)
    assert f"API key: from {source}, ending ...T9z4" in text
    assert REAL not in text and REAL[8:20] not in text


def test_a_restart_on_the_same_database_does_not_print_the_key_it_was_given_before(tmp_path):
    db = str(tmp_path / "k.db")
    proc, out, _ = start(db, [], {"SPOOLED_API_KEY": REAL})
    first = stop(proc, out)
    proc, out, url = start(db, [], {})  # nothing given now: the key it made itself, never the adopted one
    text = stop(proc, out)
    made = [line.split("API key: ", 1)[1] for line in text.splitlines() if line.startswith("API key: ")]
    assert len(made) == 1 and made[0].startswith("sp_test_") and made[0] != REAL
    assert REAL not in first + text and REAL[8:20] not in first + text


@pytest.mark.parametrize("variable", ["SPOOLED_API_KEY", "SPOOLED_DEV_API_KEY"])
def test_help_does_not_show_the_key_in_the_environment(variable):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")}
    for command in (["dev-server"], ["run"], ["dev"], ["demo"], ["enqueue"]):
        r = subprocess.run([PY, "-m", "supervisor", *command, "--help"], cwd=ROOT, env={**clean, variable: REAL},
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert REAL not in r.stdout + r.stderr and REAL[8:20] not in r.stdout + r.stderr, command
    r = subprocess.run([PY, "-m", "supervisor", "dev-server", "--help"], cwd=ROOT, env={**clean, variable: REAL},
                       capture_output=True, text=True, timeout=30)
    assert "set in the environment (not shown)" in " ".join(r.stdout.split())
