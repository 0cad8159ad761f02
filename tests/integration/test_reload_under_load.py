"""A reload under a steady stream of equal-length jobs, with real processes, with and without --preload: every
child is new soon after the SIGHUP while the stream still flows, every job started after that ran the new
code (each job's result names the code that ran it), and jobs kept starting meanwhile."""

from __future__ import annotations

import signal

import pytest
from conftest import reload_while_jobs_run

JOB = 0.5  # seconds each job runs
JOBS = 40  # 10 s of work for two children: the stream outlasts the reload by far


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preload", [False, True], ids=["plain", "preload"])
def test_a_reload_reaches_every_child_while_jobs_keep_coming(dev_server, daemon_factory, tmp_path, preload):
    version = tmp_path / "version"
    version.write_text("one")
    queue = "reload-load"
    d = daemon_factory(queue, handler="tests.support.handlers_memory:handle", procs=2,
                       args=["--preload"] if preload else [],
                       env={"MEMORY_VERSION_FILE": str(version)}).wait_ready(60)
    ids = [dev_server.enqueue(queue, {"do": "version", "secs": JOB}) for _ in range(JOBS)]
    signalled, new_at, _, runs, later = reload_while_jobs_run(d, dev_server, version, ids, first=4)
    print(f"every child new {new_at - signalled:.2f} s after the SIGHUP; {len(later)} jobs started after that")
    # The stream still flowed when every child was new: the reload did not wait for a gap in the queue.
    assert len(later) >= 4, (new_at - signalled, runs)
    assert set(later) == {"two"}, runs
    # Within one job of the first job's end and two start-ups (a start-up here is well under 2 s).
    assert new_at - signalled < 2 * JOB + 4.0, new_at - signalled
    during = [t for t, _ in runs if signalled - JOB <= t <= new_at + JOB]
    gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
    assert during and max(gaps, default=0) < 3.0, runs  # jobs kept starting while the children were replaced
    assert any(v == "one" for _, v in runs) and runs[-1][1] == "two"
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
