"""The demo and enqueue commands, run as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.timeout(90)
def test_demo_runs_jobs_end_to_end_and_prints_a_summary():
    run = subprocess.run([sys.executable, "-m", "supervisor", "demo", "--jobs", "20", "--ms", "20", "--procs", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=80)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done 20/20" in run.stdout
    m = re.search(r"summary: (\d+) completed, (\d+) dead-lettered, (\d+) left; daemon exit code 0", run.stdout)
    assert m and m.groups() == ("20", "0", "0"), run.stdout
    eff = float(re.search(r"efficiency ([0-9.]+)", run.stdout).group(1))
    assert 0.1 < eff <= 1.05


@pytest.mark.timeout(60)
def test_enqueue_submits_jobs_in_bulk(dev_server):
    env = dict(os.environ, SPOOLED_API_KEY=dev_server.api_key)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervisor",
            "enqueue",
            "--api-url",
            dev_server.url,
            "--queue",
            "q-enq",
            "--payload",
            '{"ms": 5}',
            "--count",
            "150",
            "--max-retries",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    ids = run.stdout.split()
    assert len(set(ids)) == 150 and "enqueued 150 job(s) on q-enq" in run.stderr
    job = dev_server.job(ids[-1])
    assert job["payload"] == {"ms": 5} and job["max_retries"] == 2 and job["status"] == "pending"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervisor",
            "enqueue",
            "--api-url",
            dev_server.url,
            "--queue",
            "q",
            "--payload",
            "{not json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: --payload is not valid JSON")


@pytest.mark.timeout(60)
def test_enqueue_carries_a_trace_context_in_an_object_payload(dev_server):
    env = dict(os.environ, SPOOLED_API_KEY=dev_server.api_key)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def enqueue(payload: str, traceparent: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "supervisor", "enqueue", "--api-url", dev_server.url, "--queue",
                               "q-trace", "--payload", payload, "--traceparent", traceparent], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=30)

    run = enqueue('{"n": 1}', parent)
    assert run.returncode == 0, run.stderr
    assert dev_server.job(run.stdout.strip())["payload"] == {"n": 1, "_spooled_trace": {"traceparent": parent}}
    for payload, traceparent, says in (("[1]", parent, "object payload"),
                                       ("{}", "<script>", "traceparent must look like")):
        bad = enqueue(payload, traceparent)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --traceparent: ") and says in bad.stderr
        assert len(bad.stderr.splitlines()) == 1


def test_help_lists_subcommands_and_options():
    top = subprocess.run([sys.executable, "-m", "supervisor", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert top.returncode == 0 and all(w in top.stdout for w in ("run", "dev-server", "demo", "enqueue", "status"))
    run = subprocess.run(
        [sys.executable, "-m", "supervisor", "run", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    for flag in (
        "--procs",
        "--queue",
        "--handler",
        "--api-url",
        "--api-key-file",
        "--worker-id",
        "--lease",
        "--drain-timeout",
        "--poll-interval",
        "--max-jobs-per-child",
        "--max-memory-per-child",
        "--health-port",
    ):
        assert flag in run.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "supervisor", "frobnicate"], cwd=ROOT, capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "unknown subcommand" in unknown.stderr
