"""Fuzz the dev server from the published OpenAPI spec with schemathesis, on a time budget.

Starts `python -m supervisor dev-server` on a free loopback port with a temporary database, writes the
spec with the corrections `correct()` makes (below) to a temporary file, and runs `st run` against it with
the checks `not_a_server_error` (no 5xx) and `rfc3339_timestamps` (every string a response holds under a key
ending in `_at`, or `timestamp`, is RFC 3339 with an offset, as the SDK's models read them). Prints a one-line
JSON summary (read from schemathesis's JSON report) and exits 0 when no check failed and the server answered
every request, else 1 (2 when schemathesis is not installed). Schemathesis's own errors (a crash of its data
generation, a flaky strategy) are listed under `fuzzer_errors` and fail no run: they say nothing of the server.

    python benchmarks/fuzz_devserver.py --max-time 45
    python benchmarks/fuzz_devserver.py --spec path/to/openapi.yaml --max-time 300
    python benchmarks/fuzz_devserver.py --deterministic --max-examples 5 --workers 1   # the same cases, once each

The streaming routes (`/api/v1/events*`, `/api/v1/ws`) are left out: a stream answers for as long as the
client stays, so a fuzzer's request would only wait for its timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
DEFAULT_SPEC = HERE.parent / "tests" / "schemas" / "spooled-0.1.115" / "openapi.yaml"


def bad_timestamps(value, path: str = "") -> list[str]:
    """Where a JSON value holds a time string that is not RFC 3339 (`*_at` keys and `timestamp`)."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if isinstance(v, str) and (str(k).endswith("_at") or k == "timestamp") and not RFC3339.fullmatch(v):
                found.append(f"{here}={v!r}")
            else:
                found += bad_timestamps(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += bad_timestamps(v, f"{path}[{i}]")
    return found


def correct(spec: dict) -> dict:
    """The spec with the corrections that change what a client sends or may be answered:
    `/health` has no `version`; DLQ retry's limit stops at 100; complete, fail and job heartbeat take
    `lease_id` (required by newer servers); a schedule's cron expression is 9-100 characters."""
    schemas = spec.get("components", {}).get("schemas", {})
    health = schemas.get("HealthResponse", {})
    if "version" in health.get("required", []):
        health["required"] = [r for r in health["required"] if r != "version"]
    retry = schemas.get("RetryDlqRequest", {}).get("properties", {}).get("limit")
    if isinstance(retry, dict):
        retry["maximum"] = 100
    create = schemas.get("CreateScheduleRequest", {}).get("properties", {}).get("cron_expression")
    if isinstance(create, dict):
        create.update({"minLength": 9, "maxLength": 100})
    return spec


def hooks() -> None:
    """Register the timestamp check (this module is schemathesis's hooks module in the child run)."""
    import schemathesis

    @schemathesis.check
    def rfc3339_timestamps(ctx, response, case):
        try:
            body = json.loads(response.content or b"null")
        except ValueError:  # not JSON (an empty 204, a health probe's empty 200)
            return None
        found = bad_timestamps(body)
        if found:
            raise AssertionError("invalid RFC 3339 timestamps: " + ", ".join(found[:5]))
        return None


# Errors schemathesis reports that are the server's doing (no answer, a hung or refused request); its other
# errors (a generation crash, a flaky strategy, a health check) are the fuzzer's own and fail no run.
SERVER_ERRORS = ("Network Error", "Unresponsive Operation", "Unhealthy API", "Connection Error", "Timeout")


def verdict(report: dict, alive: bool) -> dict:
    """What a run found, from schemathesis's JSON report: the failures of the checks asked for (a 5xx, a time
    that is not RFC 3339), the errors that are the server's, and the fuzzer's own errors (listed, not failing)."""
    failures = [{"check": f.get("title"), "code": f.get("code"), "count": f.get("count"),
                 "operations": f.get("operations")} for f in report.get("failures") or []]
    errors = report.get("errors") or []
    server = [e for e in errors if any(str(e.get("title", "")).startswith(t) for t in SERVER_ERRORS)]
    own = [e for e in errors if e not in server]
    cases = report.get("test_cases") or {}
    return {"ok": alive and not failures and not server, "server_alive": alive, "failures": failures,
            "server_errors": server, "fuzzer_errors": own, "cases": cases.get("generated", 0),
            "stop_reason": report.get("stop_reason")}


def run(spec_path: Path, max_time: int | None, workers: int, seed: int | None = None, max_examples: int | None = None,
        only: str | None = None, deterministic: bool = False, phases: str = "examples,coverage,fuzzing") -> dict:
    import yaml
    from _common import DevServer

    with tempfile.TemporaryDirectory(prefix="sst-fuzz-") as tmp:
        spec = correct(yaml.safe_load(spec_path.read_text()))
        corrected = Path(tmp) / "openapi.json"
        corrected.write_text(json.dumps(spec))
        report_path = Path(tmp) / "report.json"
        server = DevServer(tmp, name="fuzz").start()
        try:
            env = dict(os.environ, SCHEMATHESIS_HOOKS="fuzz_devserver",
                       PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
            cmd = [sys.executable, "-m", "schemathesis.cli", "run", str(corrected), "--url", server.url,
                   "-H", f"Authorization: Bearer {server.key}", "--checks", "not_a_server_error,rfc3339_timestamps",
                   "--workers", str(workers), "--phases", phases,
                   "--exclude-path-regex", r"^/api/v1/(events|ws)", "--request-timeout", "10",
                   "--continue-on-failure", "--suppress-health-check", "all", "--no-color",
                   "--report", "json", "--report-json-path", str(report_path)]
            if max_time is not None:  # fuzzing repeats until the budget is spent
                cmd += ["--max-time", str(max_time)]
            if deterministic:  # the same cases every run: hypothesis derandomized, no example database
                cmd += ["--generation-deterministic"]
            elif seed is not None:
                cmd += ["--seed", str(seed)]
            if max_examples is not None:
                cmd += ["--max-examples", str(max_examples)]
            if only:
                cmd += ["--include-path-regex", only]
            started = time.monotonic()
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True,  # its cache stays in tmp
                                  timeout=(max_time or 600) + 120)
            took = time.monotonic() - started
            alive = server.proc is not None and server.proc.poll() is None
        finally:
            server.stop()
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError):
            report = None
    if report is None:  # schemathesis itself failed before it could report (a bad option, a crash)
        found = {"ok": False, "server_alive": alive, "failures": [], "server_errors": [],
                 "fuzzer_errors": [{"title": f"no report (exit {proc.returncode})", "count": 1}], "cases": 0,
                 "stop_reason": None}
    else:
        found = verdict(report, alive)
    return {**found, "exit": proc.returncode, "seconds": round(took, 1), "output": proc.stdout,
            "stderr_tail": proc.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC,
                   help="the OpenAPI spec (default: the copy in tests/schemas)")
    p.add_argument("--max-time", type=int,
                   help="seconds schemathesis may spend, repeating its fuzzing until they are (default 45; with "
                        "--max-examples and no --max-time, each operation gets its examples once and the run ends)")
    p.add_argument("--workers", type=int, default=2, help="concurrent schemathesis workers (default 2)")
    p.add_argument("--max-examples", type=int, help="cases per operation and phase (default schemathesis's)")
    p.add_argument("--deterministic", action="store_true",
                   help="the same cases every run (schemathesis's deterministic mode; --seed is then unused)")
    p.add_argument("--seed", type=int, help="the seed of a random run, to repeat one (schemathesis prints it)")
    p.add_argument("--phases", default="examples,coverage,fuzzing",
                   help="schemathesis's phases to run (default examples,coverage,fuzzing)")
    p.add_argument("--only", metavar="REGEX", help="only the operations whose path matches REGEX")
    p.add_argument("--full", action="store_true", help="print schemathesis's whole output, not its last 40 lines")
    args = p.parse_args(argv)
    for name in ("max_time", "workers", "max_examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        import schemathesis  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        print(f"error: {e.name} is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 2
    if not args.spec.is_file():
        print(f"error: --spec {args.spec}: no such file", file=sys.stderr)
        return 2
    if args.max_time is None and args.max_examples is None:
        args.max_time = 45
    result = run(args.spec, args.max_time, args.workers, args.seed, args.max_examples, args.only, args.deterministic,
                 args.phases)
    lines = result["output"].splitlines()
    print("\n".join(lines if args.full else lines[-40:]))
    print(json.dumps({k: v for k, v in result.items() if k not in ("output", "stderr_tail")}))
    if not result["ok"] and result["stderr_tail"].strip():
        print(result["stderr_tail"], file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
else:
    try:
        hooks()
    except ImportError:  # imported as a plain module where schemathesis is absent
        pass
