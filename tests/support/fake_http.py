"""Misbehaving HTTP servers on loopback for the client tests, and the raw answer cases they play.

A case is one file in tests/support/http_cases/responses/<name>.http (see tests/support/http_cases/README.md):
`# key: value` lines first (expect, status, result, code, closes, drip, server-closes, why), then the
raw answer, in which line breaks are ignored, `\\r`, `\\n`, `\\xHH` are escapes and `<<N*text>>` repeats
`text` N times.
"""

from __future__ import annotations

import codecs
import json
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import requests

CASES_DIR = Path(__file__).parent / "http_cases" / "responses"
GOOD_ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"jobs":[]}'
_REPEAT = re.compile(r"<<(\d+)\*(.*?)>>")


@dataclass
class Case:
    name: str
    meta: dict[str, str]
    raw: bytes

    @property
    def drip(self) -> int:
        return int(self.meta.get("drip", "0"))

    @property
    def server_closes(self) -> bool:
        return self.meta.get("server-closes") == "yes"


def load_case(path: Path) -> Case:
    meta: dict[str, str] = {}
    body_lines: list[str] = []
    for line in path.read_text().splitlines():
        if not body_lines and line.startswith("# "):
            key, _, value = line[2:].partition(":")
            meta[key.strip()] = value.strip()
        else:
            body_lines.append(line)
    text = _REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), "".join(body_lines))
    return Case(path.stem, meta, codecs.escape_decode(text.encode("latin-1"))[0])


def all_cases() -> list[Case]:
    return [load_case(p) for p in sorted(CASES_DIR.glob("*.http"))]


def read_request(conn: socket.socket, buf: bytearray) -> bytes | None:
    """One request (head and Content-Length body) from `buf` + the socket; None at the end."""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    length = 0
    for line in bytes(buf[:end]).split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(buf) < end + length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    request = bytes(buf[:end + length])
    del buf[:end + length]
    return request


class LoopbackServer:
    """Accepts connections on a free loopback port, each served by `_serve` on its own thread, until the
    `with` block ends (every connection is closed then)."""

    def __init__(self):
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() a close alone would leave blocked
        except OSError:
            pass
        self.sock.close()
        with self.lock:
            for conn in self.open:
                conn.close()
        self.thread.join(5)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError


class MisbehavingServer(LoopbackServer):
    """Answers the first request it gets with `case.raw` (dripped if the case says so), every other request
    with GOOD_ANSWER; counts the connections it accepts."""

    def __init__(self, case: Case):
        super().__init__()
        self.case = case
        self.requests: list[bytes] = []

    def _send(self, conn: socket.socket, data: bytes, drip: int) -> None:
        if not drip:
            conn.sendall(data)
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(data), drip):
            conn.sendall(data[i:i + drip])
            if self.stop.wait(0.001):  # the server's own pacing, so each piece arrives on its own
                return

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        try:
            while True:
                request = read_request(conn, buf)
                if request is None:
                    return
                with self.lock:
                    self.requests.append(request)
                    first = len(self.requests) == 1
                if not first:
                    conn.sendall(GOOD_ANSWER)
                    continue
                self._send(conn, self.case.raw, self.case.drip)
                if self.case.server_closes:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
        except OSError:
            return
        finally:
            conn.close()


class ForwardingProxy(LoopbackServer):
    """An HTTP/1.1 front for the dev server that the daemon talks to. `first_claim`: the first claim answer
    holding jobs is passed through it (e.g. `interim_flood`) before it is sent. `fake_job`: the first claim is
    answered here with that job, and its complete call is answered here too, its raw body kept in
    `completed` (the dev server never sees the job). Everything else goes to `upstream` unchanged."""

    def __init__(self, upstream: str, first_claim=None, fake_job: dict | None = None):
        super().__init__()
        self.upstream = upstream
        self.first_claim = first_claim
        self.fake_job = fake_job
        self.claims_changed = 0
        self.completed: list[bytes] = []

    def _answer(self, request: bytes) -> bytes:
        head, _, body = request.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        fake = self.fake_job
        if fake is not None and path.endswith("/api/v1/jobs/claim") and fake.get("served") is None:
            fake["served"] = True
            job = {k: v for k, v in fake.items() if k != "served"}
            return _ok(json.dumps({"jobs": [job]}).encode())
        if fake is not None and path.endswith(f"/api/v1/jobs/{fake['id']}/complete"):
            self.completed.append(body)
            return _ok(b'{"success":true}')
        forward = {k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type")}
        r = requests.request(method, self.upstream + path, data=body, headers=forward, timeout=10)
        answer = b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            r.status_code, len(r.content), r.content)
        claim_with_jobs = path.endswith("/api/v1/jobs/claim") and b'"id"' in r.content
        if self.first_claim and not self.claims_changed and claim_with_jobs:
            self.claims_changed += 1
            answer = self.first_claim(answer)
        return answer

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        try:
            while True:
                request = read_request(conn, buf)
                if request is None:
                    return
                conn.sendall(self._answer(request))
        except OSError:
            return
        finally:
            conn.close()


def interim_flood(answer: bytes, count: int = 500) -> bytes:
    return b"HTTP/1.1 100 Continue\r\n\r\n" * count + answer


def with_chunked_too(answer: bytes) -> bytes:
    """The answer with a `Transfer-Encoding: chunked` beside its Content-Length: malformed framing."""
    return answer.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n", 1)


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
