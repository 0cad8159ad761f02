"""Fuzz the dev server from the published OpenAPI spec with schemathesis, on a time budget.

Starts `python -m supervisor dev-server` on a free loopback port with a temporary database, writes the
spec with the corrections `correct()` makes (below) to a temporary file, and runs `st run` against it with
the checks `not_a_server_error` (no 5xx) and `rfc3339_timestamps` (every string a response holds under a key
ending in `_at`, or `timestamp`, is RFC 3339 with an offset, as the SDK's models read them). Prints a one-line
JSON summary and exits 0 when schemathesis found nothing, else 1 (2 when schemathesis is not installed).

    python benchmarks/fuzz_devserver.py --max-time 45
    python benchmarks/fuzz_devserver.py --spec path/to/openapi.yaml --max-time 300

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


def run(spec_path: Path, max_time: int, workers: int) -> dict:
    import yaml
    from _common import DevServer

    with tempfile.TemporaryDirectory(prefix="sst-fuzz-") as tmp:
        spec = correct(yaml.safe_load(spec_path.read_text()))
        corrected = Path(tmp) / "openapi.json"
        corrected.write_text(json.dumps(spec))
        server = DevServer(tmp, name="fuzz").start()
        try:
            env = dict(os.environ, SCHEMATHESIS_HOOKS="fuzz_devserver",
                       PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
            cmd = [sys.executable, "-m", "schemathesis.cli", "run", str(corrected), "--url", server.url,
                   "-H", f"Authorization: Bearer {server.key}", "--checks", "not_a_server_error,rfc3339_timestamps",
                   "--max-time", str(max_time), "--workers", str(workers), "--phases", "examples,coverage,fuzzing",
                   "--exclude-path-regex", r"^/api/v1/(events|ws)", "--request-timeout", "10",
                   "--continue-on-failure", "--suppress-health-check", "all", "--no-color"]
            started = time.monotonic()
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True,  # its cache stays in tmp
                                  timeout=max_time + 120)
            took = time.monotonic() - started
            alive = server.proc is not None and server.proc.poll() is None
        finally:
            server.stop()
    tail = "\n".join(proc.stdout.splitlines()[-40:])
    return {"ok": proc.returncode == 0 and alive, "exit": proc.returncode, "server_alive": alive,
            "seconds": round(took, 1), "output_tail": tail, "stderr_tail": proc.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC,
                   help="the OpenAPI spec (default: the copy in tests/schemas)")
    p.add_argument("--max-time", type=int, default=45, help="seconds schemathesis may spend (default 45)")
    p.add_argument("--workers", type=int, default=2, help="concurrent schemathesis workers (default 2)")
    args = p.parse_args(argv)
    try:
        import schemathesis  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        print(f"error: {e.name} is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 2
    if not args.spec.is_file():
        print(f"error: --spec {args.spec}: no such file", file=sys.stderr)
        return 2
    result = run(args.spec, args.max_time, args.workers)
    print(result["output_tail"])
    print(json.dumps({k: v for k, v in result.items() if k not in ("output_tail", "stderr_tail")}))
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
