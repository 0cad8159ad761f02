"""How a child's failure is told: the error text of a handler exception, the cause of a child's death, and
the jittered job quota that recycles children."""

from __future__ import annotations

import signal

from supervisor.child.main import format_error
from supervisor.parent.childproc import death_cause, job_quota


def test_error_text_is_type_message_and_traceback_tail_within_2048():
    def deep(n):
        if n == 0:
            raise KeyError("missing field 'x'")
        deep(n - 1)

    try:
        deep(60)
    except KeyError as exc:
        text = format_error(exc)
    assert text.startswith("KeyError: \"missing field 'x'\"")
    assert len(text) <= 2048 and "in deep" in text and text.rstrip().endswith("KeyError: \"missing field 'x'\"")


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
