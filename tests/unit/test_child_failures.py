"""How a child's failure is told: the error text of a handler exception, the cause of a child's death, and
the jittered job quota that recycles children."""

from __future__ import annotations

import signal

import pytest
from support import handlers_errors

from supervisor.child import logs
from supervisor.child.handler import load_handler
from supervisor.child.main import FRAMES_NOTE, boot_error_text, format_error, run_job
from supervisor.job import Job
from supervisor.parent.childproc import death_cause, job_quota


def test_error_text_is_type_message_then_the_innermost_frames_within_2048():
    def deep(n):
        if n == 0:
            raise KeyError("missing field 'x'")
        deep(n - 1)

    try:
        deep(60)
    except KeyError as exc:
        text = format_error(exc)
    lines = text.splitlines()
    assert lines[0] == "KeyError: \"missing field 'x'\"" and lines[1] == FRAMES_NOTE
    assert "in deep" in lines[2] and "raise KeyError" in lines[3]  # the raising line first, not the outermost
    assert len(text) <= 2048


def run(handler, payload: dict) -> str:
    job = Job.parse({"id": "j-1", "lease_id": "L-1", "queue_name": "q", "payload": payload})
    assert job is not None
    reply = run_job(handler, job, "w", 1000)
    assert reply.ok is False and reply.error is not None
    return reply.error


@pytest.mark.parametrize("fn", [handlers_errors.handle, handlers_errors.handle_async])
def test_a_handler_exception_shows_the_users_frames_first_and_none_of_the_daemons(fn):
    text = run(load_handler(f"tests.support.handlers_errors:{fn.__name__}"), {"width": "wide"})
    lines = text.splitlines()
    assert lines[0] == "ValueError: invalid literal for int() with base 10: 'wide'"
    assert "handlers_errors.py" in lines[2] and "in parse_width" in lines[2]  # the raising line first
    assert f"in {fn.__name__}" in text
    assert "supervisor/child" not in text and "asyncio" not in text  # the daemon's and asyncio.run's frames go
    assert len(text[:300].splitlines()) >= 3  # the parent's "job failed" line (300 characters) keeps the line


def test_library_frames_under_the_users_are_kept_innermost_first():
    text = run(load_handler("tests.support.handlers_errors:handle_json"), {"text": "{nope"})
    frames = [line for line in text.splitlines() if line.startswith("  File")]
    assert "json" in frames[0] and "handle_json" in frames[-1], text


def test_at_debug_the_whole_traceback_is_kept(monkeypatch):
    monkeypatch.setenv(logs.CHILD_LOGGING_ENV, "json DEBUG daemon")
    text = run(load_handler("tests.support.handlers_errors:handle"), {"width": "wide"})
    assert "Traceback (most recent call last)" in text and "supervisor/child/main.py" in text


def test_an_import_error_shows_the_users_module_not_the_import_machinery(tmp_path, monkeypatch):
    (tmp_path / "broken_at_import.py").write_text("import json\n\n\ndef helper():\n    raise RuntimeError('no "
                                                  "config')\n\n\nhelper()\n")
    (tmp_path / "bad_syntax_mod.py").write_text("def f(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, first, where in [("broken_at_import:f", "RuntimeError: no config", 'broken_at_import.py", line 5'),
                               ("bad_syntax_mod:f", "SyntaxError: invalid syntax", 'bad_syntax_mod.py", line 1')]:
        with pytest.raises(Exception) as info:
            load_handler(spec)
        text = boot_error_text(info.value)
        assert text.splitlines()[0] == first and where in text.splitlines()[1 if "Syntax" in first else 2], text
        assert "importlib" not in text and "supervisor/child" not in text, text


def test_death_causes_and_job_quota_jitter():
    assert death_cause(-signal.SIGKILL) == "killed by signal 9 (not by the daemon); possibly out of memory"
    assert death_cause(-signal.SIGKILL, oom=False) == "killed by signal 9 (not by the daemon)"
    assert death_cause(-signal.SIGKILL, oom=True) == "killed by the kernel OOM killer (SIGKILL)"
    assert death_cause(-signal.SIGKILL, killed_by_daemon=True) == "killed by SIGKILL (by the daemon, after the grace " \
                                                                  "period)"
    assert death_cause(-signal.SIGSEGV) == "killed by SIGSEGV (segmentation fault)"
    assert death_cause(7) == "exited with code 7"
    quotas = {job_quota(100) for _ in range(200)}
    assert min(quotas) >= 100 and max(quotas) <= 110 and len(quotas) > 1
    assert job_quota(0) == 0
