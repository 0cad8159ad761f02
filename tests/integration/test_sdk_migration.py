"""An SDK worker module run unchanged under the real daemon: `--handler module:handle_job` and
`--handler module:worker`, the async worker, `--share-api-key` for the module's own client, and the errors
an operator sees when something is missing."""

from __future__ import annotations

import signal

import pytest
import requests
from conftest import Daemon, wait_for_status, wait_until

pytestmark = pytest.mark.timeout(90)

SHARE_HINT = ("the handler's module reads SPOOLED_API_KEY, which children get only with --share-api-key "
              "(SPOOLED_SHARE_API_KEY=1)")


def start(server, queue: str, handler: str, *, with_queue: bool = True, args: list[str] | None = None,
          env: dict | None = None, started: list | None = None, procs: int = 1) -> Daemon:
    d = Daemon(server, queue, handler=handler, procs=procs, worker_id=f"w-{queue}", args=args, env=env)
    if not with_queue:
        at = d.cmd.index("--queue")
        del d.cmd[at:at + 2]
    if started is not None:
        started.append(d)
    return d.start()


@pytest.fixture
def daemons():
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def job_lines(d: Daemon, msg: str) -> list[dict]:
    return [r for r in d.records() if r.get("logger") == "supervisor.job" and r.get("msg") == msg]


def test_the_function_form_runs_with_the_sdk_context_and_creates_a_follow_up_job(dev_server, daemons):
    job = dev_server.enqueue("sdk-fn", {"width": 3, "follow_up": "sdk-fn-next"})
    d = start(dev_server, "sdk-fn", "tests.support.sdk_app:handle_job", started=daemons,
              args=["--share-api-key", "--health-port", "0"], env={"SDK_APP_QUEUE": "elsewhere"})
    port = d.health_port
    (done,) = wait_for_status(dev_server, [job])
    result = done["result"]
    assert {k: result[k] for k in ("success", "width", "queue", "signal")} == {
        "success": True, "width": 3, "queue": "sdk-fn", "signal": "Event"}
    follow = dev_server.job(result["created"])
    assert follow["queue_name"] == "sdk-fn-next" and follow["payload"] == {"parent": job}

    wait_until(lambda: job_lines(d, "keyword form"), timeout=15, what="its last line")  # log read on a thread
    (resizing,) = job_lines(d, "resizing")
    assert (resizing["level"], resizing["width"], resizing["attempt"], resizing["job_id"], resizing["queue"]) == (
        "info", 3, 0, job, "sdk-fn")
    (odd,) = job_lines(d, "an unknown level")
    assert odd["level"] == "info" and odd["requested_level"] == "notice"
    assert job_lines(d, "progress 100%: clamped to 100")[0]["progress"] == 100
    assert job_lines(d, "keyword form")[0]["step"] == 2
    (report,) = [r for r in d.records()
                 if r["msg"].startswith("handler tests.support.sdk_app:handle_job: the SpooledWorker")]
    assert report["taken"] == {} and report["ignored"]["queue_name"] == "'elsewhere' -> --queue"
    assert report["ignored"]["concurrency"] == "10 -> --procs (processes, not threads)"

    key = dev_server.api_key
    for pid in d.child_pids():
        import psutil

        assert key not in " ".join(psutil.Process(pid).cmdline())
    status = requests.get(f"http://127.0.0.1:{port}/status", timeout=5).text
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "sdk-fn" in status and key not in status and key not in metrics
    d.stop()
    assert key not in d.out.text()


def test_the_worker_form_takes_its_queue_reports_what_it_ignored_and_never_starts_it(dev_server, daemons):
    job = dev_server.enqueue("sdk-obj", {"width": 8})
    d = start(dev_server, "sdk-obj", "tests.support.sdk_app:worker", with_queue=False, started=daemons, procs=2,
              args=["--share-api-key"], env={"SDK_APP_QUEUE": "sdk-obj"})
    d.wait_ready()  # both children up: the report below was still made once
    (starting,) = d.wait_events("supervisor starting")
    assert (starting["queue"], starting["queue_from"]) == ("sdk-obj", "tests.support.sdk_app:worker")
    (done,) = wait_for_status(dev_server, [job])
    assert done["result"]["width"] == 8 and done["result"]["queue"] == "sdk-obj"
    (report,) = [r for r in d.records()
                 if r["msg"].startswith("handler tests.support.sdk_app:worker: the SpooledWorker")]
    assert report["taken"] == {"queue_name": "sdk-obj"}
    assert set(report["ignored"]) == {"concurrency", "lease_duration"}
    assert not d.events("the SpooledWorker's event hooks (worker.on) are not run under the daemon")
    workers = dev_server.request("GET", "/api/v1/workers").json()
    assert [w["id"] for w in workers] == ["w-sdk-obj"]  # the SDK worker itself never registered
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert f"completed {job}" in d.out.lines  # its job:completed hook ran, and the child's stdout was flushed


def test_the_async_worker_awaits_its_context(dev_server, daemons):
    job = dev_server.enqueue("sdk-async", {"n": 21})
    d = start(dev_server, "sdk-async", "tests.support.sdk_app_async:worker", started=daemons, args=["--share-api-key"],
              env={"SDK_APP_QUEUE": "sdk-async"})
    (done,) = wait_for_status(dev_server, [job])
    assert done["result"] == {"doubled": 42, "signal": "Event", "stopped": False}
    (halfway,) = wait_until(lambda: job_lines(d, "halfway"), what="the awaited warn line")
    assert (halfway["level"], halfway["n"], halfway["job_id"]) == ("warning", 21, job)
    assert job_lines(d, "progress 0%")[0]["progress"] == 0


def test_the_docs_module_that_calls_start_at_import_runs_and_is_told_why_start_did_nothing(dev_server, daemons):
    job = dev_server.enqueue("sdk-docs", {"numbers": [1, 2, 3]})
    d = start(dev_server, "sdk-docs", "tests.support.sdk_app_seed:handle_job", with_queue=False, started=daemons,
              args=["--share-api-key"], env={"SDK_APP_QUEUE": "sdk-docs"})
    (done,) = wait_for_status(dev_server, [job])
    assert done["result"] == {"success": True, "total": 6}
    (warned,) = d.wait_events("the handler's module called SpooledWorker.start(); it did nothing: the daemon runs the "
                              "@process function itself")
    assert warned["level"] == "warning"
    assert [w["id"] for w in dev_server.request("GET", "/api/v1/workers").json()] == ["w-sdk-docs"]


@pytest.mark.parametrize("with_queue", [True, False], ids=["queue-given", "queue-from-worker"])
def test_without_the_switch_a_module_needing_the_key_exits_3_with_the_hint_first(dev_server, daemons, with_queue):
    d = start(dev_server, "sdk-nokey", "tests.support.sdk_app:handle_job", with_queue=with_queue, started=daemons)
    assert d.wait(60) == 3
    (error,) = [r for r in d.records() if r["level"] == "error"]
    first, second = error["msg"].split("\n")[:2]
    assert first == f"cannot import handler tests.support.sdk_app:handle_job: {SHARE_HINT}"
    assert second == "KeyError: 'SPOOLED_API_KEY'" and "Traceback" in error["msg"]
    assert dev_server.api_key not in d.out.text()


def test_a_module_that_reads_the_key_and_finds_nothing_exits_3_too(dev_server, daemons):
    d = start(dev_server, "sdk-optional", "tests.support.sdk_app_optional_key:handle_job", started=daemons)
    assert d.wait(60) == 3
    (error,) = [r for r in d.records() if r["level"] == "error"]
    assert error["msg"] == f"cannot import handler tests.support.sdk_app_optional_key:handle_job: {SHARE_HINT}"


def test_a_handler_that_is_not_one_exits_3_naming_what_it_found(dev_server, daemons):
    d = start(dev_server, "sdk-bad", "tests.support.sdk_app:client", started=daemons, args=["--share-api-key"])
    assert d.wait(60) == 3
    (error,) = [r for r in d.records() if r["level"] == "error"]
    assert error["msg"] == ("cannot import handler tests.support.sdk_app:client: "
                            "tests.support.sdk_app:client is a SpooledClient, "
                            "not a handler or a SpooledWorker")


def test_no_queue_and_a_plain_function_exits_2_in_one_line(dev_server, daemons):
    d = start(dev_server, "sdk-plain", "supervisor.demo_handlers:misbehave", with_queue=False, started=daemons)
    assert d.wait(60) == 2
    (line,) = [t for t in d.out.lines if t.strip()]
    assert line == ("error: --queue is required (or set SPOOLED_QUEUE): supervisor.demo_handlers:misbehave is not "
                    "a SpooledWorker's handler, so it names no queue")


def test_a_shared_key_in_a_job_error_or_log_line_is_scrubbed(dev_server, daemons):
    job = dev_server.enqueue("sdk-leak", {}, max_retries=0)
    d = start(dev_server, "sdk-leak", "tests.support.sdk_app_leaky:handle_job", started=daemons,
              args=["--share-api-key"])
    (failed,) = wait_for_status(dev_server, [job], statuses=("deadletter", "failed"))
    assert "refused with key ***" in failed["last_error"] and dev_server.api_key not in failed["last_error"]
    (line,) = wait_until(lambda: job_lines(d, "about to leak"), what="the handler's log line")
    assert line["key"] == "***"
    d.stop()
    assert dev_server.api_key not in d.out.text()
