"""Per-answer cost of the parent loop's response framing (supervisor.client.httpconn.ResponseReader).

    python benchmarks/bench_http_parse.py

Answers of the shapes the loop reads most (a claim of one job, a small `{"success":true}`, the claim
answer chunked) and a 64 KiB chunked one, each parsed whole on a reader that is reused the way a kept-alive connection
reuses it, and on a fresh reader (a new connection); plus the claim answer dripped 7 bytes at a time.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.client.httpconn import ResponseReader  # noqa: E402

BODY = (b'{"jobs":[{"id":"' + b"a" * 36 + b'","queue_name":"bench","payload":{"ms":0},"retry_count":0,'
        b'"max_retries":3,"timeout_seconds":300,"lease_id":"' + b"b" * 36 + b'","lease_expires_at":'
        b'"2026-12-01T07:30:00.123Z"}]}')
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
ANSWERS = {
    "claim": HEAD + b"Content-Length: %d\r\nx-api-version: 1\r\n\r\n" % len(BODY) + BODY,
    "small": HEAD + b"Content-Length: 16\r\nx-api-version: 1\r\n\r\n{\"success\":true}",
    "chunked": HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n",
    "64k-chunked": HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + (b"400\r\n" + b"x" * 1024 + b"\r\n") * 64
    + b"0\r\n\r\n",
}


def kept_alive(reader: ResponseReader, data: bytes) -> None:
    reader.expect()
    assert reader.feed(data) is not None


def fresh(data: bytes) -> None:
    assert ResponseReader().feed(data) is not None


def dripped(data: bytes, step: int = 7) -> None:
    reader = ResponseReader()
    for i in range(0, len(data), step):
        if reader.feed(data[i:i + step]) is not None:
            return
    raise AssertionError("incomplete")


def main() -> None:
    n = 100_000
    reader = ResponseReader()
    for name, data in ANSWERS.items():
        warm = min(timeit.repeat(lambda d=data: kept_alive(reader, d), number=n, repeat=3)) / n * 1e6
        new = min(timeit.repeat(lambda d=data: fresh(d), number=n, repeat=3)) / n * 1e6
        print(f"{name:11s} {len(data):5d} B  kept-alive reader {warm:5.2f} us   fresh reader {new:5.2f} us")
    drip = min(timeit.repeat(lambda: dripped(ANSWERS["claim"]), number=n // 10, repeat=3)) / (n // 10) * 1e6
    print(f"claim dripped 7 bytes a feed: {drip:.1f} us")


if __name__ == "__main__":
    main()
