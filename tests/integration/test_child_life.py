"""A child's start and end under the real daemon: --child-init once in each child (after every fork under
--preload, each with a seed of its own; one that raises in a later child retried on a back-off), and on every
graceful exit (a recycle, a reload, a drain, a replacement for memory between jobs) its atexit handlers and a
buffered logging handler flushed before it leaves."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import wait_for_status, wait_until

pytestmark = pytest.mark.timeout(90)

HANDLER = "tests.support.handlers_life:handle"
INIT = ["--child-init", "tests.support.handlers_life:init"]


def flushed(out: Path, pid: int) -> str | None:
    """The child's buffered log once its exit flushed it, with both atexit entries run; else None."""
    log = out / f"log-{pid}"
    ran = all((out / f"{name}-{pid}").exists() for name in ("atexit-import", "atexit-init"))
    return log.read_text() if ran and log.exists() and log.read_text() else None


def run_one(dev_server, queue: str) -> dict:
    (job,) = wait_for_status(dev_server, [jid := dev_server.enqueue(queue, {})])
    return {**job["result"], "id": jid}


def test_atexit_and_buffered_logs_flush_on_recycle_reload_and_drain(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("life", handler=HANDLER, procs=1, env={"LIFE_OUT": str(tmp_path)},
                       args=[*INIT, "--max-jobs-per-child", "2", "--preload"])
    first = run_one(dev_server, "life")
    d.signal(signal.SIGHUP)  # a reload replaces the child, idle after its job
    assert f"job {first['id']}" in wait_until(lambda: flushed(tmp_path, first["pid"]), timeout=15)
    second, third = run_one(dev_server, "life"), run_one(dev_server, "life")  # its quota: a recycle after it
    assert second["pid"] == third["pid"] != first["pid"]
    assert f"job {third['id']}" in wait_until(lambda: flushed(tmp_path, third["pid"]), timeout=15)
    d.wait_events("replacing child", reason="max_jobs")
    fourth = run_one(dev_server, "life")
    d.signal(signal.SIGTERM)  # a drain: the child leaves once its job is done
    assert d.wait() == 0
    assert f"job {fourth['id']}" in wait_until(lambda: flushed(tmp_path, fourth["pid"]), timeout=5)
    inits = sorted(tmp_path.glob("init-*"))
    assert len(inits) == 3 and all(len(p.read_text().splitlines()) == 1 for p in inits)  # once per child


def test_child_init_runs_once_in_each_child_after_every_fork_with_preload(dev_server, daemon_factory, tmp_path):
    daemon_factory("seeds", handler=HANDLER, procs=2, env={"LIFE_OUT": str(tmp_path)}, args=[*INIT, "--preload"])
    ids = [dev_server.enqueue("seeds", {}) for _ in range(8)]
    results = [job["result"] for job in wait_for_status(dev_server, ids)]
    seeds = {r["pid"]: r["seed"] for r in results}
    assert len(seeds) == len(set(seeds.values())) and None not in seeds.values()  # each child its own
    assert all(r["seed"] == seeds[r["pid"]] for r in results)  # and one per child, for all its jobs
    assert {r["imported_in"] for r in results}.isdisjoint(seeds)  # imported once, in the forkserver
    wait_until(lambda: len(list(tmp_path.glob("init-*"))) == 2, timeout=10)
    assert all(len(p.read_text().splitlines()) == 1 for p in tmp_path.glob("init-*"))


@pytest.mark.parametrize(("init", "says"), [
    ("tests.support.no_such_module:init", "cannot import --child-init tests.support.no_such_module:init: "
                                          "ModuleNotFoundError"),
    ("tests.support.handlers_life:NOT_CALLABLE", "--child-init tests.support.handlers_life:NOT_CALLABLE is a "
                                                 "int, not a function"),
    ("tests.support.handlers_life:missing", "has no attribute missing"),
])
def test_a_child_init_that_cannot_be_used_exits_3_with_one_line(dev_server, daemon_factory, init, says):
    d = daemon_factory("bad-init", handler=HANDLER, args=["--child-init", init])
    assert d.wait() == 3
    (line,) = [r for r in d.records() if r.get("level") == "error"]
    assert says in line["msg"] and "\n" not in line["msg"]


def test_a_child_init_that_raises_is_the_childs_boot_error(dev_server, daemon_factory):
    d = daemon_factory("raising-init", handler=HANDLER, args=["--child-init", "tests.support.handlers_life:"
                                                                             "broken_init"])
    assert d.wait() == 3  # as an import error: no child ever came up
    text = d.out.text()
    assert "--child-init tests.support.handlers_life:broken_init raised ConnectionError: the database is not " \
           "there" in text


def test_a_child_init_that_raises_in_a_later_child_is_retried_with_back_off(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("later-init", handler=HANDLER, procs=1, env={"LIFE_OUT": str(tmp_path)},
                       args=["--child-init", "tests.support.handlers_life:init_fails_while_blocked",
                             "--max-jobs-per-child", "2"])
    first = run_one(dev_server, "later-init")  # the first child came up; its replacement will not, for now
    (tmp_path / "blocked").write_text("")
    assert run_one(dev_server, "later-init")["pid"] == first["pid"]  # its second job: then it is recycled
    failed = d.wait_events("child failed while starting; backing off", count=2, timeout=30)
    assert [f["failures"] for f in failed[:2]] == [1, 2] and failed[1]["retry_in"] > failed[0]["retry_in"] * 0.5
    assert "--child-init tests.support.handlers_life:init_fails_while_blocked raised ConnectionError: the " \
           "database is not there yet" in failed[0]["error"]
    assert d.proc.poll() is None  # a boot error after a child was up is retried, not fatal
    (tmp_path / "blocked").unlink()
    second = run_one(dev_server, "later-init")
    assert second["pid"] != first["pid"]


def test_a_child_replaced_for_its_memory_between_jobs_flushes_before_it_leaves(dev_server, daemon_factory, tmp_path):
    d = daemon_factory("life-mem", handler=HANDLER, procs=1, env={"LIFE_OUT": str(tmp_path)},
                       args=[*INIT, "--max-memory-per-child", "150"])
    (job,) = wait_for_status(dev_server, [jid := dev_server.enqueue("life-mem", {"keep_mb": 200})])
    pid = job["result"]["pid"]
    d.wait_events("replacing child", reason="max_memory", pid=pid)  # idle, over the cap: replaced gracefully
    assert f"job {jid}" in wait_until(lambda: flushed(tmp_path, pid), timeout=15)
    assert run_one(dev_server, "life-mem")["pid"] != pid
