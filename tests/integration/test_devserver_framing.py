"""Raw-socket tests of the dev server's HTTP framing, limits and connection handling.

Every malformed or smuggling form is a data file under tests/support/http_cases/requests/invalid (one file
per case); each must get its JSON answer, a closed connection, and create no job. The valid cases
under .../valid must be answered in order and create exactly their jobs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httptools
import pytest
from conftest import ROOT, DevServer, wait_until
from support.http_cases import Case, cases

pytestmark = pytest.mark.timeout(90)

INVALID, VALID = cases("invalid"), cases("valid")
SWEEP_SLACK = 0.5  # the server checks its timeouts every 0.25 s
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
HEALTH_CLOSE = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class Answers:
    """Parses the answers of one connection with llhttp: [(status, headers, body)], and whether EOF came."""

    def __init__(self):
        self.items: list[tuple[int, dict, bytes]] = []
        self.eof = False
        self._headers: dict = {}
        self._body: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes):
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes):
        self._body.append(body)

    def on_message_complete(self):
        self.items.append((self._parser.get_status_code(), self._headers, b"".join(self._body)))
        self._headers, self._body = {}, []

    def read(self, sock: socket.socket, want: int | None, timeout: float = 10.0) -> Answers:
        """Read until `want` answers arrived (None: until EOF) or `timeout` s passed."""
        deadline = time.monotonic() + timeout
        while not self.eof and (want is None or len(self.items) < want):
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                break
            self._parser.feed_data(data)
        return self


def send(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):  # the server answered and closed before we finished
        pass
    return sock


def total_jobs(server: DevServer) -> int:
    return server.stats()["total"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = DevServer(str(tmp_path_factory.mktemp("framing") / "dev.db")).start()
    yield s
    s.stop()


def _check_answers(case: Case, answers: Answers) -> None:
    got = [status for status, _, _ in answers.items]
    assert got == [status for status, _ in case.statuses], (case.name, answers.items)
    for (status, code), (_, headers, body) in zip(case.statuses, answers.items, strict=True):
        if status >= 400:
            envelope = json.loads(body)
            assert headers["content-type"] == "application/json"
            assert isinstance(envelope["message"], str) and envelope["message"], envelope
            if code:
                assert envelope["code"] == code, (case.name, envelope)


@pytest.mark.parametrize("case", INVALID, ids=[c.name for c in INVALID])
def test_malformed_request_is_answered_closed_and_runs_nothing(server, case):
    before = total_jobs(server)
    with send(server.port, case.data(server.api_key)) as sock:
        answers = Answers().read(sock, None)
    assert answers.eof, f"{case.name}: the connection was not closed"
    _check_answers(case, answers)
    assert answers.items[-1][1].get("connection") == "close"
    assert total_jobs(server) == before, f"{case.name}: a job was created"
    assert server.request("GET", "/api/v1/jobs/stats").status_code == 200  # and the server is fine


@pytest.mark.parametrize("case", VALID, ids=[c.name for c in VALID])
def test_valid_request_is_framed_and_answered_in_order(server, case):
    before = total_jobs(server)
    with send(server.port, case.data(server.api_key)) as sock:
        answers = Answers().read(sock, None if case.closed else len(case.statuses))
        _check_answers(case, answers)
        if case.closed:
            assert answers.eof, f"{case.name}: the connection stayed open"
        else:  # still usable
            sock.sendall(HEALTH)
            assert answers.read(sock, len(case.statuses) + 1).items[-1][0] == 200
    assert total_jobs(server) == before + case.jobs


def test_case_files_cover_the_issue(server):
    names = {c.name for c in INVALID}
    for required in ("chunk_size_negative", "chunk_size_not_hex", "cl_plus_sign", "cl_underscore",
                     "cl_duplicate_differing", "cl_space_before_colon", "te_xchunked", "cl_and_te",
                     "headers_oversized", "cl_over_body_limit"):
        assert required in names


def test_chunked_body_is_cut_off_at_the_limit_as_it_streams(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--max-body-bytes", "4096"]).start()
    try:
        head = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.api_key}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        chunk = b"400\r\n" + b" " * 1024 + b"\r\n"
        with send(s.port, head + chunk * 5) as sock:  # 5 KiB sent, no last chunk: the body never ends
            answers = Answers().read(sock, None)
        assert answers.eof and [a[0] for a in answers.items] == [400]
        body = json.loads(answers.items[0][2])
        assert body["code"] == "INVALID_JSON" and body["details"][0]["code"] == "body_too_large"
        assert total_jobs(s) == 0
    finally:
        s.stop()


def test_hundreds_of_stalled_clients_do_not_starve_health(tmp_path):
    timeout = 4.0
    s = DevServer(str(tmp_path / "dev.db"), extra=["--request-timeout", str(timeout), "--idle-timeout", "8"]).start()
    stalled: list[socket.socket] = []
    try:
        partial = (b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Le",  # mid-headers
                   b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"que",  # mid-body
                   b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{")
        start = time.monotonic()
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            sock.sendall(partial[i % 3])
            stalled.append(sock)
        latencies = []
        for _ in range(10):
            t0 = time.monotonic()
            with send(s.port, HEALTH_CLOSE) as sock:
                answers = Answers().read(sock, 1, timeout=5)
            latencies.append(time.monotonic() - t0)
            assert [a[0] for a in answers.items] == [200]
        measured_by = time.monotonic() - start
        assert measured_by < timeout, f"health measured only after {measured_by:.1f}s: the stall had ended"
        assert max(latencies) < 1.0, latencies
        # every stalled request then gets 408 and a closed connection, not before its timeout
        for sock in stalled:
            answers = Answers().read(sock, None, timeout=timeout + 10)
            assert answers.eof and [a[0] for a in answers.items] == [408]
        assert time.monotonic() - start >= timeout - SWEEP_SLACK
        assert total_jobs(s) == 0
    finally:
        for sock in stalled:
            sock.close()
        s.stop()


def test_connection_cap_answers_503_and_frees_a_slot_on_close(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--max-connections", "4"]).start()
    held: list[socket.socket] = []

    def hold_one() -> bool:  # retried while the readiness probe's connection may still count
        sock = send(s.port, HEALTH)
        if [a[0] for a in Answers().read(sock, 1).items] == [200]:
            held.append(sock)
            return True
        sock.close()
        return False

    try:
        for _ in range(4):
            wait_until(hold_one, timeout=10, what="a connection slot")
        with send(s.port, HEALTH) as sock:
            answers = Answers().read(sock, None)
        assert answers.eof and [a[0] for a in answers.items] == [503]
        assert answers.items[0][1]["retry-after"] == "1"
        assert json.loads(answers.items[0][2])["code"] == "SERVICE_UNAVAILABLE"
        held.pop().close()
        wait_until(hold_one, timeout=10, what="the freed connection slot")
    finally:
        for sock in held:
            sock.close()
        s.stop()


def test_idle_keep_alive_connection_is_closed_after_the_idle_timeout(tmp_path):
    s = DevServer(str(tmp_path / "dev.db"), extra=["--idle-timeout", "1"]).start()
    try:
        with send(s.port, HEALTH) as sock:
            answers = Answers().read(sock, 1)
            assert answers.items[0][0] == 200 and not answers.eof
            t0 = time.monotonic()
            answers.read(sock, None, timeout=10)
            waited = time.monotonic() - t0
        assert answers.eof and len(answers.items) == 1  # closed without another answer
        assert 1.0 - SWEEP_SLACK <= waited < 8.0, waited
    finally:
        s.stop()


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
def test_bad_connection_flags_exit_2_naming_the_flag(tmp_path, value):
    for flag in ("--max-connections", "--request-timeout", "--idle-timeout", "--max-header-bytes"):
        if value == "nan" and flag in ("--max-connections", "--max-header-bytes"):
            continue
        r = subprocess.run([sys.executable, "-m", "supervisor", "dev-server", "--db", str(tmp_path / "x.db"),
                            flag, value], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and flag in r.stderr, (flag, value, r.stderr)
