"""docs/develop-locally.md, run as written: its handler file, its `dev` command and its `enqueue` command, read
from the page itself, in an empty folder (the only change: `--port 0`, so parallel tests never share a port)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support.dev_session import DevSession, end_all

PAGE = Path(__file__).resolve().parents[2] / "docs" / "develop-locally.md"
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@pytest.fixture(autouse=True)
def _end_sessions():
    yield
    end_all()


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def command(text: str, subcommand: str) -> list[str]:
    """The page's first `python -m supervisor <subcommand> ...` line, as argv after `python -m supervisor`."""
    for block in blocks(text, "sh"):
        for line in block.splitlines():
            words = shlex.split(line)
            if words[:4] == ["python", "-m", "supervisor", subcommand]:
                return words[3:]
    raise AssertionError(f"docs/develop-locally.md shows no `python -m supervisor {subcommand}` command")


@pytest.mark.timeout(120)
def test_the_page_runs_as_written(tmp_path):
    text = PAGE.read_text()
    handler = next(b for b in blocks(text, "python") if b.startswith("# app.py\n"))
    (tmp_path / "app.py").write_text(handler)
    dev = DevSession(tmp_path, *command(text, "dev")[1:], "--port", "0").start()
    assert dev.ui_url.startswith(dev.url) and "#key=" in dev.ui_url

    sent = dev.cli(*command(text, "enqueue"))
    assert sent.returncode == 0, sent.stderr
    ids = UUID.findall(sent.stdout)
    assert len(ids) == 3, sent.stdout  # the page's --count 3
    for job_id in ids:
        job = dev.settled(job_id)
        assert job["status"] == "completed" and job["result"] == {"width": 320}, job
        dev.wait_for(rf"{job_id[:8]} \| resizing")  # the handler's ctx.log line, in the dev terminal

    assert dev.stop() == 0  # step 7: Ctrl-C drains and prints a one-line summary
    dev.wait_for(r"dev: stopped after \d+ s: 3 job\(s\) completed")
