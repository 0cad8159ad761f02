"""`python -m supervisor enqueue`: submit jobs to any Spooled API (bulk, 100 at a time).

Blocking HTTP through `requests` (SpooledAPI.execute): a kept-alive session, a timeout on every
attempt; a bulk create has no idempotency key, so it is sent once, never resent. The payload's
integers are kept exact, whatever their size. Ctrl-C stops it: it prints the ids created so far, how many
and their range, and exits 130.
"""

from __future__ import annotations

import argparse
import os
import sys

from supervisor import cli, exactjson
from supervisor.child.tracing import TRACE_KEY, carry
from supervisor.client.rest import ApiError, Secret, SpooledAPI, Unauthorized
from supervisor.commands.dev import FOLDER, STATE, find_running
from supervisor.config import DEFAULT_API_URL, ConfigError, read_api_key


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("enqueue", description="Submit jobs to a Spooled queue. "
                   "The key comes from SPOOLED_API_KEY or --api-key-file. With no --api-url and no SPOOLED_API_URL, "
                   "a `dev` running in this folder (or one above) is used, with its key and queue (it writes "
                   f"{FOLDER}/{STATE} while it runs); otherwise {DEFAULT_API_URL}.")
    p.add_argument("--queue", help="queue name (default: the running dev's)")
    p.add_argument("--payload", required=True, help='job payload as JSON, e.g. \'{"ms": 50}\'')
    p.add_argument("--count", type=int, default=1, help="how many identical jobs (default 1)")
    p.add_argument("--api-url", default=os.environ.get("SPOOLED_API_URL") or None,
                   help=f"API base URL (SPOOLED_API_URL); default a running dev's (found through .spooled/dev.json "
                        f"here or above), else default {DEFAULT_API_URL}, Spooled Cloud")
    p.add_argument("--api-key-file", default=os.environ.get("SPOOLED_API_KEY_FILE"), help="file holding the API key")
    p.add_argument("--api-key", help=argparse.SUPPRESS)
    p.add_argument("--priority", type=int, help="-100..100")
    p.add_argument("--max-retries", type=int, help="0..100")
    p.add_argument("--timeout-seconds", type=int, help="1..86400")
    p.add_argument("--traceparent", help="W3C traceparent (00-<trace id>-<span id>-<flags>) the jobs' spans "
                   f"continue; put in the payload, which must be an object, under {TRACE_KEY!r}")
    p.add_argument("--quiet", action="store_true", help="print only the count, not every job id")
    return p


def enqueue(client: SpooledAPI, queue: str, payload, count: int, ids: list[str] | None = None, **fields) -> list[str]:
    """Create `count` jobs with `payload`; return their ids. Each batch's ids are added to `ids` (when given)
    as soon as it is created, so an interrupted run still knows what it made."""
    ids = [] if ids is None else ids
    if count == 1:
        ids.append(client.create_job(queue, payload, **fields)["id"])
        return ids
    defaults = {"default_priority": fields.get("priority"), "default_max_retries": fields.get("max_retries"),
                "default_timeout_seconds": fields.get("timeout_seconds")}
    for start in range(0, count, 100):
        n = min(100, count - start)
        answer = client.bulk_create(queue, [payload] * n, **defaults)
        if answer.get("failed"):
            raise ApiError(400, "BULK_PARTIAL", f"{len(answer['failed'])} jobs refused: {answer['failed'][0]}")
        ids += [item["job_id"] for item in answer["succeeded"]]
    return ids


def failure(exc: ApiError, url: str) -> str:
    """What went wrong, in the words of what happened: no connection is not a refusal."""
    if exc.status == 0 and exc.code == "TIMEOUT":
        return f"no answer from {url} in time: {exc.message}"
    if exc.status == 0:
        reason = "connection refused" if "refused" in exc.message.lower() else exc.message
        return f"could not connect to {url} ({reason}); is the server running and the URL right?"
    if isinstance(exc, Unauthorized):
        return f"the API at {url} did not accept the key: {exc}"
    return f"the API at {url} refused the jobs: {exc}"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    payload = read_payload(args)
    if payload is None:
        return 2
    if args.count < 1:
        sys.stderr.write("error: --count must be 1 or more\n")
        return 2
    dev = find_running() if args.api_url is None and not args.api_key_file else None
    if dev is not None:
        args.api_url = dev["url"]
        args.queue = args.queue or dev.get("queue")
    if not args.queue:
        sys.stderr.write("error: --queue is required (no dev is running here to take it from)\n")
        return 2
    if args.api_url is None:
        args.api_url = DEFAULT_API_URL
        sys.stderr.write(f"no --api-url or SPOOLED_API_URL given: using Spooled Cloud ({DEFAULT_API_URL})\n")
    try:
        key = Secret(dev["api_key"]) if dev is not None else read_api_key(args, os.environ)
        client = SpooledAPI(args.api_url or DEFAULT_API_URL, key, attempts=3)
    except (ConfigError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    ids: list[str] = []
    try:
        enqueue(client, args.queue, payload, args.count, ids, priority=args.priority,
                max_retries=args.max_retries, timeout_seconds=args.timeout_seconds)
    except ApiError as exc:
        sys.stderr.write(f"error: {failure(exc, args.api_url)}\n")
        if ids:
            sys.stderr.write(f"created {len(ids)} job(s) on {args.queue} before that{id_range(ids)}\n")
        return 1
    except KeyboardInterrupt:
        if not args.quiet:
            sys.stdout.write("".join(f"{job_id}\n" for job_id in ids))
        in_flight = "; the batch being sent (up to 100) may have been created too" if args.count > 1 else ""
        sys.stderr.write(f"interrupted: created {len(ids)} of {args.count} job(s) on {args.queue}{id_range(ids)}"
                         f"{in_flight}\n")
        return 130
    finally:
        client.close()
    if not args.quiet:
        sys.stdout.write("".join(f"{job_id}\n" for job_id in ids))
    sys.stderr.write(f"enqueued {len(ids)} job(s) on {args.queue}\n")
    return 0


def read_payload(args: argparse.Namespace) -> object | None:
    """--payload parsed, with --traceparent carried in; None (the error written) when either is bad."""
    try:
        payload = exactjson.loads(args.payload)
    except ValueError as exc:
        sys.stderr.write(f"error: --payload is not valid JSON: {exc}\n")
        return None
    if args.traceparent is None:
        return payload
    try:
        return carry(payload, args.traceparent)
    except ValueError as exc:
        sys.stderr.write(f"error: --traceparent: {exc}\n")
        return None


def id_range(ids: list[str]) -> str:
    """` (ids FIRST to LAST)`, ` (id ONE)` or nothing."""
    if not ids:
        return ""
    return f" (ids {ids[0]} to {ids[-1]})" if len(ids) > 1 else f" (id {ids[0]})"
