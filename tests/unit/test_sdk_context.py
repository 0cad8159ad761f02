"""The job context handlers get: the SDK's fields and signatures, both `log` forms, structured fields, and what
`--handler` accepts (checked in-process on objects built here; imports are tested with real children)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import typing

import pytest
from spooled import AsyncSpooledClient, SpooledClient
from spooled.worker import AsyncSpooledWorker, SpooledWorker
from spooled.worker import types as sdk_types

from supervisor import sdkworker
from supervisor.child.handler import (
    AsyncJobContext,
    Handler,
    HandlerSpecError,
    JobContext,
    _as_handler,
    call_handler,
    new_context,
)
from supervisor.job import Job

pytestmark = pytest.mark.timeout(30)

JOB = Job.parse({"id": "job-1", "queue_name": "images", "payload": {"w": 3}, "retry_count": 1, "max_retries": 4,
                 "timeout_seconds": 60, "lease_id": "lease-1", "lease_expires_at": "2026-01-01T00:00:00Z"})
KEY = "sp_test_context_key_0123456789"


def job_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "supervisor.job"]


def fields(record: logging.LogRecord) -> dict:
    return record.__dict__["fields"]


def test_every_field_of_the_sdk_contexts_exists_with_the_same_name_and_type():
    for ours, theirs in ((JobContext, sdk_types.JobContext), (AsyncJobContext, sdk_types.AsyncJobContext)):
        our_hints = typing.get_type_hints(ours)
        for f in dataclasses.fields(theirs):
            assert f.name in our_hints, f"{ours.__name__} lacks {f.name}"
            if f.name != "signal":
                assert our_hints[f.name] == typing.get_type_hints(theirs)[f.name], f.name
        assert callable(ours.log) and callable(ours.progress)
    sync_ctx, async_ctx = JobContext.from_claim(JOB, "w"), AsyncJobContext.from_claim(JOB, "w")
    assert isinstance(sync_ctx.signal, threading.Event) and isinstance(async_ctx.signal, asyncio.Event)
    assert (sync_ctx.job_id, sync_ctx.id, sync_ctx.queue_name) == ("job-1", "job-1", "images")
    assert sync_ctx.payload == {"w": 3}
    assert (sync_ctx.retry_count, sync_ctx.max_retries, sync_ctx.timeout_seconds) == (1, 4, 60)
    assert (sync_ctx.lease_id, sync_ctx.worker_id) == ("lease-1", "w")


def test_sdk_form_logs_at_the_sdk_level_with_meta_as_fields(caplog):
    caplog.set_level(logging.DEBUG)
    ctx = JobContext.from_claim(JOB, "w")
    ctx.log("debug", "d")
    ctx.log("info", "resized", {"width": 3, "height": 4})
    ctx.log("warn", "w", meta={"n": 1})
    ctx.log("error", "e")
    ctx.log(level="warning", message="kw")
    lines = job_lines(caplog)
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.DEBUG, "d"), (logging.INFO, "resized"), (logging.WARNING, "w"), (logging.ERROR, "e"),
        (logging.WARNING, "kw")]
    assert fields(lines[1]) == {"width": 3, "height": 4, "job_id": "job-1", "queue": "images"}
    assert fields(lines[2]) == {"n": 1, "job_id": "job-1", "queue": "images"}


def test_one_positional_argument_is_the_keyword_form(caplog):
    caplog.set_level(logging.INFO)
    ctx = JobContext.from_claim(JOB, "w")
    ctx.log("plain message", step=2, level=7, meta={"kept": True})
    (line,) = job_lines(caplog)
    assert (line.levelno, line.getMessage()) == (logging.INFO, "plain message")
    assert fields(line) == {"step": 2, "level_": 7, "meta": {"kept": True}, "job_id": "job-1", "queue": "images"}


def test_unknown_level_logs_at_info_keeping_the_level_and_never_fails(caplog):
    caplog.set_level(logging.INFO)
    ctx = JobContext.from_claim(JOB, "w")
    ctx.log("notice", "odd level", {"x": 1})
    ctx.log(42, "numeric level")
    ctx.log("info", "meta that is not a dict", ["a"])
    lines = job_lines(caplog)
    assert [r.levelno for r in lines] == [logging.INFO] * 3
    assert fields(lines[0])["requested_level"] == "notice" and fields(lines[0])["x"] == 1
    assert fields(lines[1])["requested_level"] == 42
    assert fields(lines[2])["meta"] == ["a"]


def test_meta_cannot_replace_the_job_fields_or_a_log_lines_own_keys(caplog):
    caplog.set_level(logging.INFO)
    JobContext.from_claim(JOB, "w").log("info", "m", {"job_id": "forged", "queue": "forged", "msg": "x", "ts": 1})
    (line,) = job_lines(caplog)
    assert fields(line) == {"job_id": "job-1", "queue": "images", "msg_": "x", "ts_": 1}


def test_progress_is_clamped_like_the_sdks(caplog):
    caplog.set_level(logging.INFO)
    ctx = JobContext.from_claim(JOB, "w")
    for value in (150, -5, 42.5, float("nan")):
        ctx.progress(value, "step")
    ctx.progress("n/a")
    assert [fields(r)["progress"] for r in job_lines(caplog)] == [100, 0, 42.5, 0, "n/a"]
    assert job_lines(caplog)[0].getMessage() == "progress 100%: step"


def test_coroutine_handlers_get_awaitable_log_and_progress_and_an_asyncio_signal(caplog):
    caplog.set_level(logging.INFO)

    async def handler(ctx):
        await ctx.log("warn", "awaited", {"n": 1})
        ctx.log("not awaited, still logged")
        await ctx.progress(200)
        assert not ctx.signal.is_set()
        ctx.signal.set()
        await asyncio.wait_for(ctx.signal.wait(), 1)
        return {"signal": type(ctx.signal).__name__}

    ctx = new_context(handler, JOB, "w")
    assert isinstance(ctx, AsyncJobContext)
    assert call_handler(handler, ctx) == {"signal": "Event"}
    assert [r.getMessage() for r in job_lines(caplog)] == ["awaited", "not awaited, still logged", "progress 100%"]
    assert isinstance(new_context(lambda c: None, JOB, "w"), JobContext)


def sdk_client() -> SpooledClient:
    return SpooledClient(api_key=KEY, base_url="http://127.0.0.1:9")


def test_a_spooled_worker_hands_over_its_registered_function_and_its_facts():
    worker = SpooledWorker(sdk_client(), queue_name="thumbs", concurrency=10, lease_duration=45)

    @worker.process
    def handle_job(ctx):
        return {"ok": True}

    worker.on("job:completed", lambda event: None)
    handler = _as_handler("app:worker", None, worker)
    assert handler.fn is handle_job and handler.is_async is False
    assert handler.about == {"worker": "SpooledWorker", "queue_name": "thumbs",
                             "settings": {"concurrency": "10", "lease_duration": "45"}, "hooks": ["job:completed"]}
    (taken,) = sdkworker.report("app:worker", handler.about, None)  # its hooks run: nothing to warn about
    assert taken[1]["taken"] == {"queue_name": "thumbs"}
    assert taken[1]["ignored"] == {"concurrency": "10 -> --procs (processes, not threads)",
                                   "lease_duration": "45 -> --lease"}
    (given,) = sdkworker.report("app:worker", {**handler.about, "hooks": []}, ("other",))
    assert given[1]["taken"] == {} and given[1]["ignored"]["queue_name"] == "'thumbs' -> --queue"
    (same,) = sdkworker.report("app:worker", {**handler.about, "hooks": []}, ("thumbs", "other"))
    assert same[1]["taken"] == {} and "queue_name" not in same[1]["ignored"]


def test_the_function_a_worker_registered_brings_the_workers_facts_along():
    worker = SpooledWorker(sdk_client(), queue_name="thumbs")

    @worker.process
    def handle_job(ctx):
        return None

    module = type("Module", (), {})()
    module.worker, module.handle_job = worker, handle_job
    handler = _as_handler("app:handle_job", module, handle_job)
    assert handler.fn is handle_job and handler.about["queue_name"] == "thumbs" and handler.about["settings"] == {}


def test_an_async_spooled_worker_runs_its_coroutine_function():
    worker = AsyncSpooledWorker(AsyncSpooledClient(api_key=KEY, base_url="http://127.0.0.1:9"), queue_name="aq")

    @worker.process
    async def handle_job(ctx):
        await ctx.log("info", "hi")
        return {"n": ctx.payload["w"] * 2}

    handler = _as_handler("app:worker", None, worker)
    assert isinstance(handler, Handler) and handler.is_async
    assert call_handler(handler, new_context(handler, JOB, "w")) == {"n": 6}


def test_what_is_not_a_handler_is_named_in_one_line():
    cases = [
        (sdk_client(), "app:client is a SpooledClient, not a handler or a SpooledWorker"),
        (SpooledWorker(sdk_client(), queue_name="q"),
         "app:client is a SpooledWorker with no handler registered: decorate the job function with @worker.process"),
        (SpooledClient, "app:client is the class SpooledClient, not a handler or a SpooledWorker"),
        (42, "app:client is a int, not a handler or a SpooledWorker"),
    ]
    for obj, text in cases:
        with pytest.raises(HandlerSpecError) as err:
            _as_handler("app:client", None, obj)
        assert str(err.value) == text
