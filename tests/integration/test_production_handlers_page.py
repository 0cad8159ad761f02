"""docs/production-handlers.md's `--child-init` example, run as the page says: its module written from the page's
python block, its command run from the page's sh block in the folder holding `myapp/`, against a real dev server.
Each child makes its own connection and seed after the fork (--preload)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys

import pytest
from conftest import ROOT, OutputPump, own, wait_for_status

pytestmark = pytest.mark.timeout(90)
PAGE = ROOT / "docs" / "production-handlers.md"


def block(lang: str, first: str) -> str:
    """The page's first `lang` block whose text starts with `first`."""
    for body in re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S):
        if body.startswith(first):
            return body
    raise AssertionError(f"no {lang} block starting with {first!r} in {PAGE.name}")


def test_the_child_init_example_runs_as_written(dev_server, tmp_path):
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "worker.py").write_text(block("python", "# myapp/worker.py"))
    argv = shlex.split(block("sh", "python -m supervisor run").strip())
    assert argv[:3] == ["python", "-m", "supervisor"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPOOLED_")},
           "SPOOLED_API_URL": dev_server.url, "SPOOLED_API_KEY": dev_server.api_key}
    proc = own(subprocess.Popen([sys.executable, *argv[1:], "--procs", "2", "--log-format", "json"], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True))
    out = OutputPump(proc.stdout)
    try:
        ids = [dev_server.enqueue("q", {"n": n}) for n in range(8)]
        results = [job["result"] for job in wait_for_status(dev_server, ids)]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        out.drain()
    assert code == 0, out.text()[-2000:]
    rows = sqlite3.connect(tmp_path / "myapp.db").execute("SELECT job_id, pid FROM runs").fetchall()
    assert sorted(job for job, _ in rows) == sorted(ids)  # every job wrote through its child's own connection
    by_pid: dict[int, list[float]] = {}
    for r in results:
        by_pid.setdefault(r["pid"], []).append(r["draw"])
    firsts = [draws[0] for draws in by_pid.values()]
    assert len(set(firsts)) == len(firsts)  # each child its own seed: no two children draw the same numbers
